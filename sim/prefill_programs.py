"""A prefill step's attention as the engine's prefill kernel runs it: its programs, and how far the
longest of them keep the step waiting beyond the kernel's work spread over the GPU.

The kernel (kernels.prefill_attention) runs one program per (sequence, KV head, query tile of
block_q tokens: engine.core.prefill_tiles), and each program walks, one after the other, every key
its tile sees: the sequence's cached keys, then its causal part. A cost model that prices the
attention by its work (query-key pairs) assumes the programs keep the GPU busy to the end. A small
chunk after a long cached context does not: 16 tokens after 2,048 cached keys on Qwen3-0.6B (8 KV
heads, block_q 32) are 8 programs of 2,064 keys on 132 SMs, each walking its keys serially; on
the H200 grid that step took 2.57 ms against 1.27 ms fresh, where its 33k extra pairs are worth
~20 us at the fit's price of a pair (experiments/autoscale/h200_run3/README.md). A profile fitted
without a term for this prices fresh prompts above what they took and chunks after a cached
context below (its knots sit between the two).

The term (one per step, summed over layers, in keys): the launch's programs are list-scheduled in
launch order onto num_sms x programs_per_sm slots (an SM holds that many at once), each walking
its keys at one rate, and the step is charged what that makespan exceeds the same keys spread
evenly over the slots: num_layers x max(0, makespan - total keys / slots). It is 0 where the
programs fill the GPU evenly (a long fresh prompt: its work prices it as before), and about the
longest program's keys where a few long programs run alone. The profiled model fits its
coefficient (seconds per key: one program's inverse walking rate) on the grid's rows beside the
other linear features (sim.profiled_regimes); experiments/kernels/prefill_balance.py measures the
rate on a GPU.

Launch order: a CUDA graph's kernel reads a tile map sorted longest tile first (kernels.prefill_tiles
.query_tiles), its grid (KV heads, map entries), the heads of one entry side by side; an eager
launch's grid is (sequences, KV heads, query tiles), and its first wave takes the tile that starts
at (longest query's tiles - 1) x block_q in every sequence and head, the longest query's last.
A mixed step's decodes ride in the same kernel as one-token queries over their contexts.

The cached context's K/V bytes (PREFILL_CACHED_KV_BYTES, opt-in: cached_kv): the K and V the
attention reads for the tokens cached before each chunk, summed over sequences and layers, on one
rank. Many short chunks after a long cached context fill the slots evenly (no excess keys) yet
read gigabytes: on an H200, 32-64 sequences of 16 tokens after 2-8k cached tokens ran at 3.7-4.2
TB/s of K and V (experiments/kernels/prefill_balance_h200/README.md), HBM-bound. A fit with the
column prices that read at a fitted rate (seconds per byte).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.plan import StepPlan
from engine.core.prefill_tiles import tile_shape
from sim.decode_programs import walk_seconds
from sim.features import row_sequences
from sim.specs import HardwareSpec, ModelSpec

# the step feature (and profile column) that carries the term to the profiled model's fits
PREFILL_PROGRAM_KEYS = "prefill_program_keys"
# the cached context's K/V bytes a prefill step's attention reads (module doc; opt-in)
PREFILL_CACHED_KV_BYTES = "prefill_cached_kv_bytes"
PREFILL_TERMS = (PREFILL_PROGRAM_KEYS, PREFILL_CACHED_KV_BYTES)
# the step totals PrefillPrograms.row_keys derives it from (cuda_graph optional: eager without)
ROW_KEY_FEATURES = ("num_prefill_tokens", "num_decode_tokens", "num_seqs", "prefill_context_tokens",
                    "decode_context_tokens")


@dataclass(frozen=True)
class PrefillPrograms:
    """num_kv_heads: per rank; group: query heads per KV head (sets the tile); programs_per_sm:
    programs one SM holds at once (hardware field prefill_programs_per_sm); kv_bytes_per_token: K and
    V of one cached token over all layers, on one rank (0: unknown); cached_kv: a fit takes the
    cached context's K/V bytes too (module doc; needs kv_bytes_per_token)."""

    num_kv_heads: int
    group: int
    num_layers: int
    num_sms: int
    programs_per_sm: int
    element_bytes: int = 2
    kv_bytes_per_token: int = 0
    cached_kv: bool = False

    def __post_init__(self) -> None:
        for name in ("num_kv_heads", "group", "num_layers", "num_sms", "programs_per_sm", "element_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PrefillPrograms.{name} must be an int >= 1, got {value!r}")
        if isinstance(self.kv_bytes_per_token, bool) or not isinstance(self.kv_bytes_per_token, int) \
                or self.kv_bytes_per_token < 0:
            raise ValueError(f"PrefillPrograms.kv_bytes_per_token must be an int >= 0, got {self.kv_bytes_per_token!r}")
        if self.cached_kv and not self.kv_bytes_per_token:
            raise ValueError("PrefillPrograms.cached_kv needs kv_bytes_per_token > 0")

    @classmethod
    def of(cls, model: ModelSpec, hardware: HardwareSpec, tp_size: int = 1,
           cached_kv: bool = False) -> PrefillPrograms | None:
        """The engine's prefill kernel for this model on this GPU at tp_size, or None where the
        hardware lacks its figures (num_sms, prefill_programs_per_sm); cached_kv: fit the cached
        context's K/V bytes too."""
        if hardware.num_sms is None or hardware.prefill_programs_per_sm is None:
            return None
        heads = model.kv_heads_per_rank(tp_size)
        element = model.kv_bytes_per_token_per_rank(tp_size) // (2 * model.num_layers * heads * model.head_dim)
        return cls(heads, model.num_heads // model.num_kv_heads, model.num_layers, hardware.num_sms,
                   hardware.prefill_programs_per_sm, max(int(element), 1),
                   model.kv_bytes_per_token_per_rank(tp_size), cached_kv)

    @property
    def slots(self) -> int:
        return self.num_sms * self.programs_per_sm

    def launch_keys(self, query_lens: Sequence[int], context_lens: Sequence[int], graph: bool) -> np.ndarray:
        """Keys each program of the launch walks, in the order the GPU starts them (module doc)."""
        q = np.asarray(query_lens, np.int64)
        c = np.asarray(context_lens, np.int64)
        keep = q > 0
        q, c = q[keep], c[keep]
        if q.size == 0:
            return np.zeros(0)
        block_q = tile_shape(self.group, int(q.max()), self.element_bytes).block_q
        tiles = -(-q // block_q)
        seq = np.repeat(np.arange(q.size), tiles)
        index = np.arange(int(tiles.sum())) - np.repeat(np.cumsum(tiles) - tiles, tiles)
        keys = c[seq] + np.minimum((index + 1) * block_q, q[seq])  # the last query of the tile sees these
        if graph:  # the map's tiles longest first, each one's KV heads side by side
            return np.repeat(np.sort(keys)[::-1], self.num_kv_heads).astype(float)
        # the grid is (sequences, KV heads, query tiles), sequence fastest, tile slowest, and its
        # first wave takes the longest query's last tile (tile index counted back from it)
        back = int(tiles.max()) - 1 - index
        waves = [np.tile(keys[back == w][np.argsort(seq[back == w], kind="stable")], self.num_kv_heads)
                 for w in range(int(tiles.max()))]
        return np.concatenate(waves).astype(float)

    def excess_keys(self, query_lens: Sequence[int], context_lens: Sequence[int], graph: bool) -> float:
        """num_layers x (the launch's makespan in keys walked - its keys spread evenly over the
        slots), >= 0 (module doc)."""
        keys = self.launch_keys(query_lens, context_lens, graph)
        if keys.size == 0:
            return 0.0
        slots = self.slots
        makespan = walk_seconds(keys, slots if keys.size > slots else None, np.inf, 1.0)
        return self.num_layers * max(0.0, makespan - float(keys.sum()) / slots)

    def plan_keys(self, plan: StepPlan, graph: bool) -> float:
        """excess_keys of a planned step's prefill kernel launch (0 for a decode-only step, which
        the decode kernel runs)."""
        if all(entry.is_decode for entry in plan.scheduled):
            return 0.0
        query = [len(entry.token_ids) for entry in plan.scheduled]
        context = [entry.num_computed_tokens for entry in plan.scheduled]
        return self.excess_keys(query, context, graph)

    def row_keys(self, row: Mapping[str, float]) -> float:
        """excess_keys of a step table's row, from its totals: the prefill chunks and their cached
        contexts evened out (exact for the profiling grid's shapes, sim.features.row_sequences),
        each decode a one-token query over the decodes' mean context."""
        prefill, decodes = int(row["num_prefill_tokens"]), int(row["num_decode_tokens"])
        if prefill <= 0:
            return 0.0
        sizes = row_sequences(prefill, decodes, int(row["num_seqs"]))
        chunks = len(sizes) - decodes
        cached = int(row["prefill_context_tokens"]) // max(chunks, 1)
        own = int(row["decode_context_tokens"]) // decodes - 1 if decodes else 0
        context = [cached] * chunks + [max(own, 0)] * decodes
        return self.excess_keys(sizes, context, bool(row.get("cuda_graph", 0)))

    def column(self, rows: Sequence[Mapping[str, float]]) -> list[float]:
        return [self.row_keys(row) for row in rows]

    def cached_kv_bytes(self, features: Mapping[str, float]) -> float:
        """The K/V bytes of a prefill step's cached context, all layers on one rank (module doc);
        0 for a decode-only step, whose contexts the decode kernel reads."""
        if features["num_prefill_tokens"] <= 0:
            return 0.0
        if not self.kv_bytes_per_token:
            raise ValueError(f"{PREFILL_CACHED_KV_BYTES} needs the model's K/V bytes a token (kv_bytes_per_token)")
        return float(features["prefill_context_tokens"]) * self.kv_bytes_per_token

    def terms(self, features: Mapping[str, float], keys: float) -> dict[str, float]:
        """The step's prefill columns (PREFILL_TERMS; the K/V bytes where kv_bytes_per_token is
        known), given its program term keys."""
        if not self.kv_bytes_per_token:
            return {PREFILL_PROGRAM_KEYS: keys}
        return {PREFILL_PROGRAM_KEYS: keys, PREFILL_CACHED_KV_BYTES: self.cached_kv_bytes(features)}
