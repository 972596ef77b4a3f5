"""Roofline cost model: a step's time from the model's shape and the hardware's peaks.

NOTE: a step is priced phase by phase, each phase taking max(compute time, memory time), and the
phases are summed. Summing per-phase maxima (rather than taking one max of the totals) lets a
decode step be memory-bound in attention while its large-batch MLP is compute-bound. Because
every phase's time is at least its memory time and efficiencies are <= 1, a step can never beat
(bytes it must read) / (peak bandwidth).

Phases, per rank of a tensor-parallel group:
- linear layers (q/k/v/o, gate/up/down): 2 * params FLOPs per token; weights read once per step
  plus each token's activations in and out;
- experts (mixture-of-experts models only; sim.moe.ExpertPhase, docs/moe-pricing.md): the weights
  of the distinct experts the step's tokens touch (an expectation under routing_skew), 2 x the
  top-k experts' params FLOPs per token padded to the grouped GEMM's tile; the linear phase then
  holds attention, the routers (replicated on every rank) and the dense layers' MLPs. With
  expert_parallel (whole experts per rank) the busiest rank's experts and pairs instead, plus
  the engine's measured cost of its dispatch and whole-expert GEMMs (sim.moe_ranks.RankExpertPhase,
  hardware.expert_parallel_layer_s and expert_parallel_efficiency); its partial outputs are summed
  by the same all-reduce;
- attention: 4 * heads * head_dim FLOPs per (query, key) pair (QK^T and PV), causal within a
  prefill chunk and over the whole cached context; KV of the cached context read, new KV written;
  a KV block that another sequence of the step reads too (a shared prefix, StepStats.
  repeated_kv_tokens) is read from memory once and from L2 (hardware.l2_bandwidth) after that;
- LM head: only for sampled positions (a prefill chunk that does not finish its prompt samples
  nothing); its weights, and float32 logits out;
- TP communication: two all-reduces per layer plus one after the vocab-parallel embedding, ring or
  one-shot, and for the sampled rows an exchange of each rank's best tokens or an all-gather of
  their logits (sim.roofline_comm);
- fixed host overhead per step and per scheduled sequence.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from engine.core.expert_parallel import check_expert_parallel
from engine.core.plan import StepPlan
from sim.features import attention_pairs, decode_attention_pairs
from sim.moe import ExpertPhase
from sim.moe_ranks import RankExpertPhase
from sim.roofline_comm import Collectives, gathers_logits
from sim.specs import HardwareSpec, ModelSpec

_LOGIT_BYTES = 4  # logits are computed in float32 for sampling
_SCALAR_REPEATS = 16  # decode_run_prices prices this many repeats or fewer one by one


class RooflineCostModel:
    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp_size: int = 1, all_reduce: str = "nccl",
                 routing_skew: float = 0.0, expert_parallel: bool = False) -> None:
        model.check_tp(tp_size)
        check_expert_parallel(model, tp_size, expert_parallel)
        self.model = model
        self.hardware = hardware
        self.tp_size = tp_size
        tp = tp_size
        hw = hardware
        dt = model.dtype_bytes
        layers = model.num_layers
        hidden = model.hidden_size
        q_width = model.num_heads // tp * model.head_dim
        kv_width = model.kv_heads_per_rank(tp) * model.head_dim
        inter = model.intermediate_size // tp
        vocab = model.vocab_size // tp
        # Precomputed once: step_time() runs for every simulated step.
        self._matmul_rate = hw.peak_flops * hw.matmul_efficiency
        self._attention_rate = hw.peak_flops * hw.attention_efficiency
        self._bandwidth = hw.mem_bandwidth * hw.bandwidth_efficiency
        self._linear_flops_per_token = 2.0 * layers * model.layer_linear_params(tp)
        self._linear_weight_bytes = float(model.body_params_per_rank(tp) * dt)
        # Activations in and out of each projection, the embedding row and the residual stream.
        # qkv: hidden -> q + 2 kv; o: q -> hidden; gate/up: hidden -> 2 inter; down: inter -> hidden
        per_layer_io = (hidden + q_width + 2 * kv_width) + (q_width + hidden) + (hidden + 2 * inter) + (inter + hidden)
        self._activation_bytes_per_token = float((layers * per_layer_io + 2 * hidden) * dt)
        self._attention_flops_per_pair = 4.0 * layers * (model.num_heads // tp) * model.head_dim
        self._experts: ExpertPhase | RankExpertPhase | None = None
        if model.is_moe:
            self._moe_parts(model, tp, routing_skew, expert_parallel and tp > 1)
        self._kv_bytes_per_token = float(model.kv_bytes_per_token_per_rank(tp))
        l2 = hw.l2_bandwidth * hw.bandwidth_efficiency if hw.l2_bandwidth is not None else self._bandwidth
        # seconds saved per KV token read again from L2 rather than memory
        self._repeat_saving_s = self._kv_bytes_per_token * (1.0 / self._bandwidth - 1.0 / l2)
        self._lm_flops_per_row = 2.0 * hidden * vocab
        self._lm_weight_bytes = float(model.lm_head_params(tp) * dt)
        self._lm_bytes_per_row = float(hidden * dt + vocab * _LOGIT_BYTES)
        self._step_overhead = hw.step_overhead_s
        self._seq_overhead = hw.seq_overhead_s
        self._comm = Collectives(model, hw, tp, all_reduce)
        self._num_all_reduces = self._comm.count
        self._decode_cache: tuple[StepPlan, tuple[int, int, float, tuple[float, ...], float]] | None = None

    def _moe_parts(self, model: ModelSpec, tp: int, routing_skew: float, expert_parallel: bool) -> None:
        """The linear phase without the experts (attention, routers, dense layers' MLPs); the
        experts priced by their own phase (sim.moe.ExpertPhase: the distinct experts' weights;
        sim.moe_ranks.RankExpertPhase: the busiest rank's, with expert parallelism)."""
        dt = model.dtype_bytes
        # a rank holds E / tp whole experts or every expert's 1 / tp: the same weights either way
        experts = model.num_moe_layers * model.expert_params(tp)
        hw, rates = self.hardware, (self._matmul_rate, self._bandwidth)
        self._experts = (RankExpertPhase(model, tp, routing_skew, *rates, hw.expert_parallel_layer_s,
                                         hw.expert_parallel_efficiency)
                         if expert_parallel else ExpertPhase(model, tp, routing_skew, *rates))
        self._linear_flops_per_token = 2.0 * (model.active_linear_params(tp) - model.num_experts_per_tok * experts)
        self._linear_weight_bytes = float((model.body_params_per_rank(tp) - model.num_experts * experts) * dt)
        hidden = model.hidden_size
        q_width = model.num_heads // tp * model.head_dim
        attention_io = (hidden + q_width + 2 * model.kv_heads_per_rank(tp) * model.head_dim) + (q_width + hidden)
        inter = model.intermediate_size // tp
        dense_io = (hidden + 2 * inter) + (inter + hidden)
        router_io = hidden + model.num_experts
        per_token = (model.num_layers * attention_io + model.num_dense_layers * dense_io
                     + model.num_moe_layers * router_io + 2 * hidden)
        self._activation_bytes_per_token = float(per_token * dt)

    def step_time(self, plan: StepPlan) -> float:
        scheduled = plan.scheduled
        num_seqs = len(scheduled)
        # NOTE: one plain loop for the three sums: this is the simulator's hottest loop, and for the
        # batches of a few to a few dozen entries it runs, a loop costs a third of sum(map(attrgetter)).
        num_tokens = context = num_sampled = 0
        for entry in scheduled:
            num_tokens += len(entry.token_ids)
            context += entry.num_computed_tokens
            num_sampled += entry.sample
        if num_tokens == num_seqs:
            pairs = decode_attention_pairs(context, num_tokens)  # one new token each
        else:
            pairs = sum(attention_pairs(len(entry.token_ids), entry.num_computed_tokens) for entry in scheduled)
        whole_vocab = bool(self._num_all_reduces and num_sampled) and gathers_logits(plan)
        return self.time_for(num_tokens, num_sampled, context, pairs, num_seqs, plan.stats.repeated_kv_tokens,
                             whole_vocab)

    def decode_repeats(self, plan: StepPlan) -> Iterator[float]:
        """step_time() of plan's repeats (a decode step; engine.core.fast_forward), each with every
        context j tokens longer, j = 1, 2, ...: the same arithmetic on the same totals."""
        scheduled = plan.scheduled
        num_seqs = len(scheduled)
        context = sum(entry.num_computed_tokens for entry in scheduled)
        whole_vocab = bool(self._num_all_reduces and num_seqs) and gathers_logits(plan)
        repeated = plan.stats.repeated_kv_tokens
        for j in itertools.count(1):
            context_j = context + j * num_seqs
            yield self.time_for(num_seqs, num_seqs, context_j, decode_attention_pairs(context_j, num_seqs), num_seqs,
                                repeated, whole_vocab)

    def decode_run_prices(self, plan: StepPlan, first: int, count: int) -> list[float]:
        """decode_repeats() of repeats first .. first + count - 1, bit for bit: time_for()'s
        arithmetic, operation for operation, with the terms that are the same at every repeat
        computed once (a few repeats one by one, more on numpy arrays of the contexts)."""
        n, context0, fixed, tail, seqs = self._decode_terms(plan)
        bw, saving = self._bandwidth, self._repeat_saving_s * plan.stats.repeated_kv_tokens
        per_pair, rate, kv = self._attention_flops_per_pair, self._attention_rate, self._kv_bytes_per_token
        step = self._step_overhead
        if count <= _SCALAR_REPEATS:
            out = []
            for c in range(context0 + first * n, context0 + (first + count) * n, n):
                attention = per_pair * decode_attention_pairs(c, n) / rate
                memory = kv * (c + n) / bw - saving
                total = fixed + (attention if attention > memory else memory)
                for term in tail:
                    total += term
                out.append(total + step + seqs)
            return out
        context: npt.NDArray[np.int64] = np.arange(first, first + count, dtype=np.int64) * n + context0
        attention_a = per_pair * decode_attention_pairs(context, np.full(count, n, dtype=np.int64)) / rate
        memory_a = kv * (context + n) / bw - saving
        totals = fixed + np.where(attention_a > memory_a, attention_a, memory_a)
        for term in tail:
            totals += term
        prices: list[float] = (totals + step + seqs).tolist()
        return prices

    def _decode_terms(self, plan: StepPlan) -> tuple[int, int, float, tuple[float, ...], float]:
        """Of a decode plan's repeats: sequences, summed contexts (of the plan), the linear (and
        experts) phase, the terms time_for() adds after attention, in its order (LM head, then
        all-reduces and the sampling exchange), and the per-sequence overhead; kept for the plan
        last asked about (fast-forward prices one plan's repeats in several calls)."""
        cached = self._decode_cache
        if cached is not None and cached[0] is plan:
            return cached[1]
        scheduled = plan.scheduled
        n = len(scheduled)
        bw = self._bandwidth
        linear = self._linear_flops_per_token * n / self._matmul_rate
        memory = (self._linear_weight_bytes + self._activation_bytes_per_token * n) / bw
        fixed = linear if linear > memory else memory
        if self._experts is not None:
            fixed += self._experts.time(n)
        tail: list[float] = []
        if n:
            lm_head = self._lm_flops_per_row * n / self._matmul_rate
            memory = (self._lm_weight_bytes + self._lm_bytes_per_row * n) / bw
            tail.append(lm_head if lm_head > memory else memory)
        if self._num_all_reduces:
            tail.append(self._comm.all_reduces(n))
            if n:
                tail.append(self._comm.sampling(n, gathers_logits(plan)))
        terms = (n, sum(entry.num_computed_tokens for entry in scheduled), fixed, tuple(tail), self._seq_overhead * n)
        self._decode_cache = (plan, terms)
        return terms

    def drained(self) -> None:
        """Steps are priced alone: whether one was in flight changes nothing (sim.cost_model)."""

    def time_for(self, num_tokens: int, num_sampled: int, context_tokens: int, attention_pairs: int,
                 num_seqs: int, repeated_tokens: int = 0, whole_vocab: bool = False) -> float:
        """Price a step from its totals.

        context_tokens: KV tokens already in the cache that the step's requests attend to;
        attention_pairs: (query, key) pairs over all requests, causal; repeated_tokens: of the
        context tokens, those read again from a block another request of the step read;
        whole_vocab: tensor-parallel ranks gather the sampled rows' logits (gathers_logits).
        """
        bw = self._bandwidth
        linear = self._linear_flops_per_token * num_tokens / self._matmul_rate
        memory = (self._linear_weight_bytes + self._activation_bytes_per_token * num_tokens) / bw
        total = linear if linear > memory else memory
        if self._experts is not None:
            total += self._experts.time(num_tokens)
        attention = self._attention_flops_per_pair * attention_pairs / self._attention_rate
        memory = self._kv_bytes_per_token * (context_tokens + num_tokens) / bw - self._repeat_saving_s * repeated_tokens
        total += attention if attention > memory else memory
        if num_sampled:
            lm_head = self._lm_flops_per_row * num_sampled / self._matmul_rate
            memory = (self._lm_weight_bytes + self._lm_bytes_per_row * num_sampled) / bw
            total += lm_head if lm_head > memory else memory
        if self._num_all_reduces:
            total += self._comm.all_reduces(num_tokens)
            if num_sampled:
                total += self._comm.sampling(num_sampled, whole_vocab)
        return total + self._step_overhead + self._seq_overhead * num_seqs

    def phase_times(self, num_tokens: int, num_sampled: int, context_tokens: int, attention_pairs: int,
                    num_seqs: int, repeated_tokens: int = 0, whole_vocab: bool = False) -> dict[str, float]:
        """Seconds per phase; their sum is time_for() (reports use it to explain a prediction).

        time_for() repeats this arithmetic without building a dict: it runs once per step.
        """
        bw = self._bandwidth
        linear = max(self._linear_flops_per_token * num_tokens / self._matmul_rate,
                     (self._linear_weight_bytes + self._activation_bytes_per_token * num_tokens) / bw)
        attention = max(self._attention_flops_per_pair * attention_pairs / self._attention_rate,
                        self._kv_bytes_per_token * (context_tokens + num_tokens) / bw
                        - self._repeat_saving_s * repeated_tokens)
        lm_head = 0.0
        if num_sampled:
            lm_head = max(self._lm_flops_per_row * num_sampled / self._matmul_rate,
                          (self._lm_weight_bytes + self._lm_bytes_per_row * num_sampled) / bw)
        phases = {"linear": linear, "attention": attention, "lm_head": lm_head,
                  "communication": self.communication_time(num_tokens, num_sampled, whole_vocab),
                  "overhead": self.host_time(num_seqs)}
        if self._experts is not None:
            phases["experts"] = self._experts.time(num_tokens)
        return phases

    def communication_time(self, num_tokens: int, num_sampled: int, whole_vocab: bool = False) -> float:
        """Seconds of tensor-parallel collectives in a step (0 at tp_size 1): per all-reduce its
        latency plus 2 (tp - 1) / tp of [num_tokens, hidden] activations over one GPU's link
        (ring), or a one-shot launch's price where the step is small enough for one
        (sim.roofline_comm); for sampling, one latency, plus (tp - 1) / tp of [num_sampled, vocab]
        logits (model dtype) when whole_vocab (they are gathered). Neither shrinks as tp grows."""
        if not self._num_all_reduces:
            return 0.0
        comm = self._comm.all_reduces(num_tokens)
        if num_sampled:
            comm += self._comm.sampling(num_sampled, whole_vocab)
        return comm

    def host_time(self, num_seqs: int) -> float:
        """The step's fixed host overhead: the same on every rank count (rank 0's Python)."""
        return self._step_overhead + self._seq_overhead * num_seqs
