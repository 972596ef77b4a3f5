"""Model shape and hardware figures: everything the cost models and the memory planner know.

Both are frozen dataclasses. HardwareSpec's fields are exactly the keys of conf/hardware/*.yaml;
a ModelSpec comes from a named model of engine.core.model_shapes (conf/model/<name>.yaml names
it as `preset` and may override any ModelSpec field).

Per-rank quantities take the tensor-parallel size as an argument; the sharding follows
Megatron-style TP as nano-vllm does it: attention heads, MLP columns and the vocabulary are split
across ranks, norms are replicated, and KV heads are replicated when there are fewer of them than
ranks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from engine.core.config import KV_CACHE_DTYPES, kv_element_bytes

from engine.core.model_shapes import DTYPE_BYTES as _DTYPE_BYTES
from engine.core.model_shapes import ModelShape, model_shape


def _check_positive(owner: str, name: str, value: Any, types: tuple[type, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, types):
        allowed = " or ".join(t.__name__ for t in types)
        raise TypeError(f"{owner}.{name} must be {allowed}, got {type(value).__name__} ({value!r})")
    if not value > 0:
        raise ValueError(f"{owner}.{name} must be > 0, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (Qwen3 / Qwen2 / Llama family; biases are ignored)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    tie_word_embeddings: bool = False
    kv_cache_dtype: str = "auto"  # what the KV cache stores: the cache's setting (with_kv_cache)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            _check_positive("ModelSpec", name, getattr(self, name), (int,))
        if self.dtype_bytes not in (1, 2, 4) or isinstance(self.dtype_bytes, bool):
            raise ValueError(f"ModelSpec.dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"ModelSpec.kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention")

    @classmethod
    def from_shape(cls, shape: ModelShape) -> ModelSpec:
        """The simulator's view of a named model: its shape and the width of its weights."""
        shared = {f.name for f in fields(cls)} - {"dtype_bytes", "kv_cache_dtype"}
        return cls(dtype_bytes=shape.dtype_bytes, **{name: getattr(shape, name) for name in shared})

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> ModelSpec:
        """Read a Hugging Face config.json (as a dict) of a Qwen3, Qwen2 or Llama model."""
        missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                               "intermediate_size", "vocab_size") if k not in config]
        if missing:
            raise ValueError(f"HF config lacks {missing}: not a Qwen3/Qwen2/Llama config.json")
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
        dtype = str(dtype).removeprefix("torch.")
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"HF config dtype {dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
        head_dim = config.get("head_dim") or hidden // heads
        return cls(
            name=name or config.get("_name_or_path") or config.get("model_type", "model"),
            num_layers=config["num_hidden_layers"],
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            dtype_bytes=_DTYPE_BYTES[dtype],
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    # ---- tensor parallelism -----------------------------------------------------------------

    def check_tp(self, tp_size: int) -> None:
        """Raise ValueError unless the shape shards evenly over tp_size ranks."""
        _check_positive("tp_size", "value", tp_size, (int,))
        for name in ("num_heads", "intermediate_size", "vocab_size"):
            if getattr(self, name) % tp_size:
                raise ValueError(f"tp_size={tp_size} must divide {self.name}'s {name} ({getattr(self, name)})")
        if self.num_kv_heads % tp_size and tp_size % self.num_kv_heads:
            raise ValueError(f"tp_size={tp_size} and {self.name}'s num_kv_heads ({self.num_kv_heads}) "
                             "must divide one another")

    def kv_heads_per_rank(self, tp_size: int = 1) -> int:
        # More ranks than KV heads: each rank keeps a replica of one KV head.
        return max(1, self.num_kv_heads // tp_size)

    # ---- parameters ---------------------------------------------------------------------------

    def layer_linear_params(self, tp_size: int = 1) -> int:
        """Weights of one layer's projections (q, k, v, o, gate, up, down) held by one rank."""
        q_out = self.num_heads // tp_size * self.head_dim
        kv_out = self.kv_heads_per_rank(tp_size) * self.head_dim
        mlp = 3 * self.hidden_size * (self.intermediate_size // tp_size)
        return self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size + mlp

    def _layer_norm_params(self) -> int:
        return 2 * self.hidden_size + 2 * self.head_dim  # input/post-attention norms, q/k norms

    def lm_head_params(self, tp_size: int = 1) -> int:
        return self.vocab_size // tp_size * self.hidden_size

    def body_params_per_rank(self, tp_size: int = 1) -> int:
        """Everything but the embedding and the LM head: the layers and the final norm."""
        return self.num_layers * (self.layer_linear_params(tp_size) + self._layer_norm_params()) + self.hidden_size

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
    # $ per GPU-hour to rent one: the deployment search (harness.plan) costs fleets with it; each
    # conf/hardware entry cites its figure. None: unpriced (the search refuses such an entry).
    price_per_gpu_hour: float | None = None
    # bytes/s the L2 cache serves reads at (peak, scaled by bandwidth_efficiency like
    # mem_bandwidth): the price of a KV block that another sequence of the step read just before
    # (engine.core.kv_reads, sim.repeated_reads). None: no figure, repeats priced as memory reads.
    l2_bandwidth: float | None = None

    @property
    def prices_one_shot(self) -> bool:
        """Whether the one-shot all-reduce's figures are known (engine.core.collectives)."""
        return self.one_shot_latency_s is not None and self.one_shot_bandwidth is not None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("price_per_gpu_hour", "l2_bandwidth", "one_shot_latency_s", "one_shot_bandwidth") and value is None:
                continue
            if f.name == "name":
                if not isinstance(value, str) or not value:
                    raise TypeError(f"HardwareSpec.name must be a non-empty str, got {value!r}")
            elif f.name == "mem_bytes":
                if isinstance(value, float) and value.is_integer():
                    value = int(value)  # "80.0e+9" in YAML
                    object.__setattr__(self, f.name, value)
                _check_positive("HardwareSpec", f.name, value, (int,))
            elif f.name.endswith("_s"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                    raise ValueError(f"HardwareSpec.{f.name} must be a number >= 0, got {value!r}")
                object.__setattr__(self, f.name, float(value))
            else:
                _check_positive("HardwareSpec", f.name, value, (int, float))
                object.__setattr__(self, f.name, float(value))
                if f.name.endswith("_efficiency") and value > 1:
                    raise ValueError(f"HardwareSpec.{f.name} must be in (0, 1], got {value!r}")
