"""A decode step's attention as the engine's split-KV kernel runs it: its programs, and the time
the longest of them add beyond the KV read that a cost model prices by the step's total context.

The engine cuts each (sequence, KV head) into programs of at most the batch's fair share of keys
(engine.core.decode_split): with fewer than two programs per SM that is the keys over four
programs per SM, from two on the batch's mean context. One program streams its keys at no more
than a rate of its own (a chain of dependent block-table and KV loads: hardware field
decode_program_bandwidth, measured by experiments/kernels/decode_balance.py). A cost model that
prices the read by total context assumes enough programs to keep the memory busy until the end;
with long contexts just past two programs per SM they are not, and the longest pieces finish
alone. On an H200 with 8 KV heads and 4.3k-token contexts, a step of 33 sequences took 6.27 ms
against 4.99 ms for one of 32 (experiments/disagg/h200x4_pd_mixes/run2).

The price (per layer; every layer runs the same programs): all programs start together, share the
bandwidth the cost model prices a context token at, and each runs at most at the program rate, so
once fewer remain than that bandwidth needs, the step waits on the longest (a fluid model, no fitted
constant). What the longest pieces add over total keys / bandwidth is `excess_s`.

A launch's split count S bounds a program from below by L / S keys (chunk = max(L / S, fair share)),
and it is the launch's, not the step's: an eager launch takes it from its own sequences and their
longest context, but a CUDA graph keeps the one it was captured with, for its padded batch size
and the longest context it was captured for (GraphSizes.decode_context, the engine's
max_model_len: 16 splits at 16,384). So in a graph a ragged batch of short contexts (the longest
under two fair shares or under BALANCE_CHUNK) is cut into pieces of the fair share, where an eager
launch of it walks its longest sequences whole or in halves: priced as eager, a bursty H100 cell's
steps of 33-39 sequences of about 750 keys waited 65 us on average, in their graphs 42-61 us.

Only steps of at least two programs per SM (engine.core.decode_split.mean_share) are priced so.
Below, the kernel cuts the keys into four programs per SM, and what few short programs cost is
in the profile already: its grid measured those batches down to 128-token contexts, and a fit's
per-batch price holds them (adding the fluid's wait there would count it twice: +68 us on a step
of one 128-token sequence). From two programs per SM on, a program walks the mean context, and
the grid's rows (even contexts up to 3,072 tokens, at least 384 programs) have no such wait, so
the fit cannot hold what served long contexts add.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.decode_split import BLOCK_N, choose_num_splits, fair_share, mean_share

# the key of a step's features that carries excess_s to the profiled model's price (not a profile column)
PROGRAM_EXCESS = "decode_program_excess_s"


@dataclass(frozen=True)
class DecodePrograms:
    """num_kv_heads: per rank; key_bytes: one key's K and V of one head (2 x head_dim x dtype bytes);
    program_bandwidth: bytes/s one program streams at most."""

    num_kv_heads: int
    num_layers: int
    key_bytes: int
    num_sms: int
    program_bandwidth: float

    def __post_init__(self) -> None:
        for name in ("num_kv_heads", "num_layers", "key_bytes", "num_sms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DecodePrograms.{name} must be an int >= 1, got {value!r}")
        if not self.program_bandwidth > 0:
            raise ValueError(f"DecodePrograms.program_bandwidth must be > 0 bytes/s, got {self.program_bandwidth!r}")

    def split_count(self, lens: np.ndarray, graph: tuple[int, int] | None = None) -> int:
        """The launch's split count (engine.core.decode_split.choose_num_splits): a CUDA graph's,
        graph = (its batch size, the longest context it was captured for), or else an eager
        launch's, from the real sequences lens and the longest of them (module doc)."""
        if graph is not None:
            return choose_num_splits(graph[0], self.num_kv_heads, graph[1], self.num_sms, balanced=True)
        return choose_num_splits(int(lens.size), self.num_kv_heads, int(lens.max()), self.num_sms, balanced=True)

    def programs(self, seq_lens: Sequence[int], graph: tuple[int, int] | None = None) -> np.ndarray:
        """The keys each program of one KV head walks, ascending (every KV head runs the same;
        a length of 0 is padding), in a launch of split_count(graph)."""
        lens = _real(seq_lens)
        if lens.size == 0:
            return lens
        heads, sms = self.num_kv_heads, self.num_sms
        splits = self.split_count(lens, graph)
        pieces = -(-lens // splits)  # the even rule: L / S in whole tiles, or the fair share if longer
        chunk = np.maximum(np.maximum(BLOCK_N, -(-pieces // BLOCK_N) * BLOCK_N),
                           fair_share(int(lens.size), int(lens.sum()), heads, sms))
        keys = np.concatenate((np.repeat(chunk, lens // chunk), lens % chunk))
        return np.sort(keys[keys > 0])

    def applies(self, num_seqs: int) -> bool:
        """Whether a decode step of num_seqs real sequences is priced here (module doc: at least two
        programs per SM); below, excess_s is 0 whatever the contexts."""
        return mean_share(num_seqs, self.num_kv_heads, self.num_sms)

    def excess_s(self, seq_lens: Sequence[int], seconds_per_token: float,
                 graph: tuple[int, int] | None = None) -> float:
        """Seconds the step's attention takes beyond its total context x seconds_per_token (the cost
        model's price of one context token over all layers and this rank's KV heads); >= 0. Zero
        below two programs per SM (module doc). graph: the CUDA graph that runs the step, as
        split_count takes it (None: an eager launch)."""
        heads = self.num_kv_heads
        if seconds_per_token <= 0 or not self.applies(int(_real(seq_lens).size)):
            return 0.0
        keys = self.programs(seq_lens, graph)
        bandwidth = heads * self.num_layers / seconds_per_token  # head-keys/s in one layer's pass
        rate = self.program_bandwidth / self.key_bytes  # head-keys/s of one program
        running = heads * np.arange(keys.size, 0, -1)  # programs still walking while passing keys[i]
        walked = np.diff(keys, prepend=0)  # keys each of them walks in that phase
        fluid = float(np.dot(walked, 1.0 / np.minimum(rate, bandwidth / running)))
        return max(0.0, self.num_layers * (fluid - heads * float(keys.sum()) / bandwidth))


def _real(seq_lens: Sequence[int]) -> np.ndarray:
    lens = np.fromiter(seq_lens, np.int64)
    return lens[lens > 0]
