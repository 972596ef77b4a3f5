"""Model shape and hardware figures: everything the cost models and the memory planner know.

Both are frozen dataclasses. HardwareSpec's fields are exactly the keys of conf/hardware/*.yaml;
a ModelSpec is an engine.core.model_shapes.ModelShape (the one description of a model) plus the KV
cache's dtype: conf/model/<name>.yaml names a described model as `preset` and may override any
of its fields.

Per-rank quantities take the tensor-parallel size as an argument; the sharding follows
Megatron-style TP as nano-vllm does it: attention heads, MLP columns and the vocabulary are split
across ranks, norms are replicated, and KV heads are replicated when there are fewer of them than
ranks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from engine.core.config import KV_CACHE_DTYPES, kv_element_bytes
from engine.core.model_shapes import ModelShape, check_positive, model_shape


@dataclass(frozen=True)
class ModelSpec(ModelShape):
    """The simulator's view of a model: every field of its description (engine.core.model_shapes,
    so a field added there is a field here, and a conf/model override) and what its KV cache
    stores. Counts each architecture's own tensors (biases, q/k norms) and prices the Qwen3 / Qwen2 /
    Llama decoders alike."""

    kv_cache_dtype: str = "auto"  # what the KV cache stores: the cache's setting (with_kv_cache)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"ModelSpec.kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")

    @classmethod
    def from_shape(cls, shape: ModelShape) -> ModelSpec:
        """The simulator's view of a described model, its KV cache storing the model's dtype."""
        return cls(**{f.name: getattr(shape, f.name) for f in fields(ModelShape)})

    # ---- tensor parallelism -----------------------------------------------------------------

    def check_tp(self, tp_size: int) -> None:
        """Raise ValueError unless the shape shards evenly over tp_size ranks."""
        check_positive("tp_size", "value", tp_size, (int,))
        sharded = ["num_heads", "vocab_size"]
        sharded += ["intermediate_size"] if self.num_dense_layers else []
        sharded += ["moe_intermediate_size"] if self.is_moe else []
        for name in sharded:
            if getattr(self, name) % tp_size:
                raise ValueError(f"tp_size={tp_size} must divide {self.name}'s {name} ({getattr(self, name)})")
        if self.num_kv_heads % tp_size and tp_size % self.num_kv_heads:
            raise ValueError(f"tp_size={tp_size} and {self.name}'s num_kv_heads ({self.num_kv_heads}) "
                             "must divide one another")

    def kv_heads_per_rank(self, tp_size: int = 1) -> int:
        # More ranks than KV heads: each rank keeps a replica of one KV head.
        return max(1, self.num_kv_heads // tp_size)

    # ---- parameters ---------------------------------------------------------------------------

    def attention_params(self, tp_size: int = 1) -> int:
        """Weights of one layer's q, k, v and o projections held by one rank."""
        q_out = self.num_heads // tp_size * self.head_dim
        kv_out = self.kv_heads_per_rank(tp_size) * self.head_dim
        biases = (q_out + 2 * kv_out) * self.qkv_bias + self.hidden_size * self.o_bias
        return self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size + biases

    def layer_linear_params(self, tp_size: int = 1) -> int:
        """Weights of one dense layer's projections (q, k, v, o, gate, up, down) held by one rank."""
        inter = self.intermediate_size // tp_size
        mlp = 3 * self.hidden_size * inter + (2 * inter + self.hidden_size) * self.mlp_bias
        return self.attention_params(tp_size) + mlp

    # ---- mixture of experts: TP shards each expert's intermediate dimension; the router is
    # replicated (every rank routes every token) ----------------------------------------------

    @property
    def num_dense_layers(self) -> int:
        """Layers with the dense MLP (all of a dense model's)."""
        return self.num_layers - self.num_moe_layers

    def expert_params(self, tp_size: int = 1) -> int:
        """One expert's gate, up and down held by one rank."""
        return 3 * self.hidden_size * (self.moe_intermediate_size // tp_size)

    @property
    def router_params(self) -> int:
        """One MoE layer's router gate (hidden x num_experts; 0 for a dense model)."""
        return self.hidden_size * self.num_experts

    def moe_layer_params(self, tp_size: int = 1) -> int:
        """Attention, router and every expert of one MoE layer, held by one rank."""
        return self.attention_params(tp_size) + self.router_params + self.num_experts * self.expert_params(tp_size)

    def active_linear_params(self, tp_size: int = 1) -> int:
        """Projection weights one token multiplies by, over all layers, on one rank: each MoE layer's
        attention, router and top-k experts, each dense layer's projections (a dense model's
        num_layers x layer_linear_params)."""
        experts = self.num_experts_per_tok * self.expert_params(tp_size)
        moe = self.attention_params(tp_size) + self.router_params + experts
        return self.num_dense_layers * self.layer_linear_params(tp_size) + self.num_moe_layers * moe

    def _layer_norm_params(self) -> int:
        return 2 * self.hidden_size + 2 * self.head_dim * self.qk_norm  # input/post-attention norms, q/k norms

    def lm_head_params(self, tp_size: int = 1) -> int:
        return self.vocab_size // tp_size * self.hidden_size

    def body_params_per_rank(self, tp_size: int = 1) -> int:
        """Everything but the embedding and the LM head: the layers (every expert of each MoE layer)
        and the final norm."""
        layers = self.num_dense_layers * self.layer_linear_params(tp_size)
        if self.is_moe:
            layers += self.num_moe_layers * self.moe_layer_params(tp_size)
        return layers + self.num_layers * self._layer_norm_params() + self.hidden_size

    @property
    def active_params(self) -> int:
        """Parameters one token uses (embedding row and LM head included, as model cards count
        them): a dense model's num_params; an MoE model's attention, router and top-k experts."""
        embed = self.lm_head_params(1)
        lm_head = 0 if self.tie_word_embeddings else embed
        norms = self.num_layers * self._layer_norm_params() + self.hidden_size
        return embed + lm_head + self.active_linear_params(1) + norms

    def num_params_per_rank(self, tp_size: int = 1) -> int:
        embed = self.lm_head_params(tp_size)
        lm_head = 0 if self.tie_word_embeddings else embed
        return embed + lm_head + self.body_params_per_rank(tp_size)

    def weight_bytes_per_rank(self, tp_size: int = 1) -> int:
        return self.num_params_per_rank(tp_size) * self.dtype_bytes

    def kv_bytes_per_token_per_rank(self, tp_size: int = 1) -> int:
        """K and V of one token over all layers, on one rank."""
        element = kv_element_bytes(self.kv_cache_dtype, self.dtype_bytes)
        return 2 * self.num_layers * self.kv_heads_per_rank(tp_size) * self.head_dim * element

    def with_kv_cache(self, kv_cache_dtype: str) -> ModelSpec:
        """This model with the KV cache a CacheConfig.kv_cache_dtype stores (engine.core.config)."""
        return replace(self, kv_cache_dtype=kv_cache_dtype)

    @property
    def num_params(self) -> int:
        return self.num_params_per_rank(1)

    @property
    def weight_bytes(self) -> int:
        return self.weight_bytes_per_rank(1)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes_per_token_per_rank(1)


def preset_fields(name: str) -> dict[str, Any]:
    """The ModelSpec fields of the model named `name` in engine.core.model_shapes, as a dict a
    config can override; ValueError names the model's spelling or the known models."""
    return asdict(ModelSpec.from_shape(model_shape(name)))


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (per rank) and the runtime overheads around it.

    peak_flops: dense bf16 matmul FLOP/s; mem_bandwidth: bytes/s; mem_bytes: device memory as the
    runtime reports it; interconnect_bandwidth: bytes/s per device as the vendor quotes it (NVLink:
    both directions together). The efficiency factors scale peaks to what kernels attain; the
    defaults are the ratios measured on an H100 (conf/hardware/h100.yaml says how).
    """

    name: str
    peak_flops: float
    mem_bandwidth: float
    mem_bytes: int
    interconnect_bandwidth: float
    step_overhead_s: float = 0.0
    # Host work per scheduled sequence (input preparation, block tables, sampling bookkeeping).
    seq_overhead_s: float = 0.0
    matmul_efficiency: float = 0.807  # 798 / 989 TFLOP/s bf16 matmul measured on the lent H100
    # FlashAttention-3 paper (Shah et al., 2024): FlashAttention-2 reaches ~35% of H100 peak.
    attention_efficiency: float = 0.35
    bandwidth_efficiency: float = 0.896  # 3.0 / 3.35 TB/s device copy measured on the lent H100
    # Ring all-reduce uses one direction of each link (half the quoted bidirectional figure), and
    # NCCL reaches ~80% of that on NVLink: 0.5 * 0.8.
    interconnect_efficiency: float = 0.4
    interconnect_latency_s: float = 1.0e-5  # per collective: launch and synchronisation
    # The engine's one-shot all-reduce (ExecutionConfig.all_reduce, engine.core.collectives): a
    # launch costs one_shot_latency_s + (tp - 1) x bytes / one_shot_bandwidth (each rank writes its
    # tensor into every peer's memory). None: not measured, such a run cannot be priced.
    one_shot_latency_s: float | None = None
    one_shot_bandwidth: float | None = None
    # $ per GPU-hour to rent one: the deployment search (harness.plan.search) costs fleets with it; each
    # conf/hardware entry cites its figure. None: unpriced (the search refuses such an entry).
    price_per_gpu_hour: float | None = None
    # bytes/s the L2 cache serves reads at (peak, scaled by bandwidth_efficiency like
    # mem_bandwidth): the price of a KV block that another sequence of the step read just before
    # (engine.core.kv_reads, sim.repeated_reads). None: no figure, repeats priced as memory reads.
    l2_bandwidth: float | None = None
    # A disaggregated fleet's KV transfers (sim.kv_transfer): GPUs one NVLink domain joins (a pool's TP
    # group stays inside one); bytes/s one GPU sends one way over NVLink and over the network (its own
    # NIC); a transfer's fixed cost on each. None: no figure, a fleet that needs it is refused.
    gpus_per_node: int = 8
    nvlink_bandwidth: float | None = None
    network_bandwidth: float | None = None
    nvlink_latency_s: float | None = None
    network_latency_s: float | None = None
    # bytes/s a new replica reads its weights at (local NVMe or network storage): an autoscaled
    # fleet's cold start (harness.autoscale). None: no figure, such a fleet cannot scale up.
    weight_load_bytes_per_s: float | None = None
    # Expert parallelism (execution.expert_parallel) on this engine, beyond the busiest rank's
    # roofline (sim.moe_ranks.RankExpertPhase): seconds per MoE layer and step (its routing runs as
    # separate launches where sliced experts run one fused router), and the fraction of the roofline's
    # rate its whole-expert grouped GEMMs reach. 0 and 1: priced by the roofline alone.
    expert_parallel_layer_s: float = 0.0
    expert_parallel_efficiency: float = 1.0
    # The engine's split-KV decode kernel (sim.decode_programs): the GPU's streaming multiprocessors,
    # and the bytes/s one of the kernel's programs walks its keys at, at most. None: no figure, a
    # decode step's KV read is priced by its total context alone. decode_programs_per_sm: how many
    # of the kernel's programs one SM holds at once (its occupancy); None: a launch's programs all
    # run from its start.
    num_sms: int | None = None
    decode_program_bandwidth: float | None = None
    decode_programs_per_sm: int | None = None
    # The engine's prefill attention kernel (sim.prefill_programs): how many of its programs (one
    # query tile of one sequence and KV head each) one SM holds at once. None: no figure, a prefill
    # step's attention is priced by its work alone.
    prefill_programs_per_sm: int | None = None
    # Host time the engine's loop spends before an idle device's first kernel of a step (planning,
    # the device clock's anchor, the batch's building), priced with SimConfig.idle_start
    # (sim.executor). None: no figure, idle_start is refused.
    idle_start_host_s: float | None = None
    # What a disaggregated decode replica's device spends writing a landed request's KV from its
    # receive staging into the paged cache (engine.kv_link.BlockMover.scatter, on the compute stream
    # before the next step): base + the request's KV bytes (per TP rank) / bandwidth, priced with
    # SimConfig.kv_scatter (sim.executor). None: no figure, kv_scatter is refused.
    kv_scatter_base_s: float | None = None
    kv_scatter_bandwidth: float | None = None
    # The GPU's die and its board power limit (W): a power curve measured on one GPU
    # (sim.power_limit) prices another of the same die and limit, whose clock falls at the same
    # draw. None: no figure, only a curve measured on this GPU applies.
    chip: str | None = None
    power_limit_w: float | None = None

    def check_tp_in_node(self, tp_size: int) -> None:
        """Raise ValueError when a TP group of tp_size ranks would span nodes: its all-reduce is
        priced on one node's links (interconnect_bandwidth), which do not join two nodes."""
        if tp_size > self.gpus_per_node:
            raise ValueError(f"TP size {tp_size} exceeds the {self.gpus_per_node} GPUs of one {self.name} node "
                             "(hardware.gpus_per_node): a TP group stays inside a node")

    @property
    def prices_one_shot(self) -> bool:
        """Whether the one-shot all-reduce's figures are known (engine.core.collectives)."""
        return self.one_shot_latency_s is not None and self.one_shot_bandwidth is not None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            optional = ("price_per_gpu_hour", "l2_bandwidth", "one_shot_latency_s", "one_shot_bandwidth",
                        "nvlink_bandwidth", "network_bandwidth", "nvlink_latency_s", "network_latency_s",
                        "weight_load_bytes_per_s", "num_sms", "decode_program_bandwidth",
                        "decode_programs_per_sm", "prefill_programs_per_sm", "idle_start_host_s",
                        "kv_scatter_base_s", "kv_scatter_bandwidth", "chip", "power_limit_w")
            if f.name in optional and value is None:
                continue
            if f.name in ("name", "chip"):
                if not isinstance(value, str) or not value:
                    raise TypeError(f"HardwareSpec.{f.name} must be a non-empty str, got {value!r}")
            elif f.name in ("mem_bytes", "gpus_per_node", "num_sms", "decode_programs_per_sm",
                            "prefill_programs_per_sm"):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)  # "80.0e+9" in YAML
                    object.__setattr__(self, f.name, value)
                check_positive("HardwareSpec", f.name, value, (int,))
            elif f.name.endswith("_s"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                    raise ValueError(f"HardwareSpec.{f.name} must be a number >= 0, got {value!r}")
                object.__setattr__(self, f.name, float(value))
            else:
                check_positive("HardwareSpec", f.name, value, (int, float))
                object.__setattr__(self, f.name, float(value))
                if f.name.endswith("_efficiency") and value > 1:
                    raise ValueError(f"HardwareSpec.{f.name} must be in (0, 1], got {value!r}")
