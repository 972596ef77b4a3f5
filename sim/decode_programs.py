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
of one 128-token sequence). Only at the grid's mean: the fit's one context price leaves long
contexts of few sequences short (the H200 grid's rows of one sequence rise 1.4e-7 s a token against
2.6e-8, experiments/fidelity/code_completion_h200_r5/README.md). That is not the programs' walk but
the merge of a sequence's partials, which its last program does one split after another: a graph
keeps many splits for few sequences, so the merge grows with the context up to the split count
(used_splits; 9.0 us a step per merged split for Qwen3-0.6B on an H200,
experiments/fidelity/small_batch_decode_h200/README.md), which backend.decode_merge fits as a term
(sim.decode_merge; off by default). From two
programs per SM on, a program
walks the mean context, and the grid's rows (even contexts up to 3,072 tokens, at least 384
programs) have no such wait, so the fit cannot hold what served long contexts add.

An SM holds only so many of the kernel's programs at once (its occupancy: hardware field
decode_programs_per_sm, 5 on the GH100 for the engine's kernel). A launch of more programs than the
GPU holds runs them as slots free up, in launch order: split-major, then KV head, then sequence
(the kernel's grid is (sequence, KV head, split), sequence fastest). The last to start walk with few
others in flight, at no more than the program rate: a wave's tail. On Qwen3-0.6B's H200 decode steps
of ragged conversation contexts this is a step from 82 sequences (656 programs, one wave of 660)
to 84 (+0.8 ms on 5.0 ms), fading by 125 and again past 165 (experiments/disagg/h200x4_pd_mixes/run2).
The fluid then schedules the programs in launch order onto the slots (in walked keys every running
program moves alike, so that order is a list schedule) and prices each stretch at the rate of the
programs running in it.

Beyond the grid's spread (SimConfig.decode_programs_baseline="grid_spread"): the profile's context
price is fitted on grid decode rows whose contexts spread evenly over [mean / 2, 3 mean / 2]
(harness.calibration.grid, its decode shapes), and those rows' own waves and tails are in the fit
already. So a step is charged only what its contexts add over a batch of the same size and mean
context spread that way (its quantiles: grid_spread_lens); a batch more even than that is charged
less. On one H100's served Azure steps (Qwen3-0.6B, 48-160 sequences) the engine's decode graph
steps ran over their price by more the more ragged the running set was (context CV quartiles: -0.3,
+2.1, +2.7, +4.3%); with the waves priced beyond the grid's spread the medians are +1.7 / -0.9 /
-0.8 / -0.6% (experiments/serve/h100_run6_aiperf/ITL80.md).

Less the grid's waves ("grid_waves"): what the fit holds of that spread is its waves (the grid's
rows of 96 and more sequences pass 660 programs), not the wait of its programs started together
(its rows of 33 and more sequences keep at least 384 programs of at most 3,072 keys in flight). So
only what the spread's waves add over the same spread with every program started at once is taken
off: a step in one wave keeps its whole wait, as the long-context cliff at 33 sequences needs (which
"grid_spread" takes off: the H200 measure calls' 0.6B long cells at 0.8 fall to -18.6..-37.3%).
Served H200 Azure steps of 73-95 sequences are then priced within -2.5..+2.3% of their time, and
the committed measure calls go from 599 to 624 of 755 comparisons within target
(experiments/disagg/decode_waves.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.core.decode_split import BLOCK_N, choose_num_splits, fair_share, mean_share
from engine.core.plan import StepPlan

# programs of the engine's decode kernel one SM of the GH100 die (H100, H200) holds: read off served
# steps' jump at 83 sequences and the compiled kernel's registers (tests/kernels/test_decode_attention.py).
# conf/hardware leaves decode_programs_per_sm null (h200.yaml says why); runs that price the waves set it.
GH100_DECODE_PROGRAMS_PER_SM = 5
# the key of a step's features that carries excess_s to the profiled model's price (not a profile column)
PROGRAM_EXCESS = "decode_program_excess_s"
DECODE_PROGRAMS_BASELINES = ("none", "grid_spread", "grid_waves")  # SimConfig.decode_programs_baseline (module doc)
# a decode step's longest chain of split partials merged one after another (sim.decode_merge)
DECODE_MERGE_SPLITS = "decode_merge_splits"
GRID_SPREAD = 0.5  # the grid's decode contexts: mean x [1 - GRID_SPREAD, 1 + GRID_SPREAD] (harness.calibration.grid)


def launch_graph(features: Mapping[str, Any], decode_context: int) -> tuple[int, int] | None:
    """A decode step's CUDA graph as DecodePrograms.split_count takes it: (its padded batch size,
    the context it was captured for); None for an eager step or an unknown capture context."""
    return (int(features["graph_batch_size"]), decode_context) if features["cuda_graph"] and decode_context else None


def plan_lens(plan: StepPlan, ahead: int = 0) -> list[int]:
    """Each scheduled sequence's context after the step, `ahead` tokens further (a repeat's)."""
    return [e.num_computed_tokens + len(e.token_ids) + ahead for e in plan.scheduled]


def grid_spread_lens(num_seqs: int, mean: float) -> np.ndarray:
    """The contexts of a grid decode row of num_seqs sequences around mean: the quantiles of the
    grid's even spread (module doc), at least 1 token each."""
    quantiles = (np.arange(num_seqs) + 0.5) / num_seqs
    return np.maximum(1, np.rint(mean * (1 - GRID_SPREAD + 2 * GRID_SPREAD * quantiles))).astype(np.int64)


@dataclass(frozen=True)
class DecodePrograms:
    """num_kv_heads: per rank; key_bytes: one key's K and V of one head (2 x head_dim x dtype bytes);
    program_bandwidth: bytes/s one program streams at most; resident_per_sm: programs one SM holds
    at once (None: every program of a launch runs from its start); baseline: what step_excess_s
    counts the wait from (DECODE_PROGRAMS_BASELINES, module doc)."""

    num_kv_heads: int
    num_layers: int
    key_bytes: int
    num_sms: int
    program_bandwidth: float
    resident_per_sm: int | None = None
    baseline: str = "none"

    def __post_init__(self) -> None:
        for name in ("num_kv_heads", "num_layers", "key_bytes", "num_sms", "resident_per_sm"):
            value = getattr(self, name)
            if name == "resident_per_sm" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DecodePrograms.{name} must be an int >= 1, got {value!r}")
        if self.baseline not in DECODE_PROGRAMS_BASELINES:
            raise ValueError(f"DecodePrograms.baseline must be one of {list(DECODE_PROGRAMS_BASELINES)}, "
                             f"got {self.baseline!r}")
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
        pieces = self._pieces(_real(seq_lens), graph)
        keys = pieces[pieces > 0]
        return np.sort(keys)

    def launch_order(self, seq_lens: Sequence[int], graph: tuple[int, int] | None = None) -> np.ndarray:
        """The keys of every program of the launch (all KV heads), in the order the GPU starts
        them: split-major, then KV head, then sequence; programs with nothing to walk left out.
        graph: as split_count takes it."""
        pieces = self._pieces(_real(seq_lens), graph)
        if pieces.size == 0:
            return pieces
        rows = [np.tile(row[row > 0], self.num_kv_heads) for row in pieces]
        return np.concatenate(rows)

    def used_splits(self, seq_lens: Sequence[int], graph: tuple[int, int] | None = None) -> np.ndarray:
        """Programs each real sequence's keys take (per KV head) in a launch of split_count(graph): a
        sequence of more than one has its partials merged, one after another, by the last of them."""
        used: np.ndarray = (self._pieces(_real(seq_lens), graph) > 0).sum(axis=0)
        return used

    def merge_splits(self, seq_lens: Sequence[int], graph: tuple[int, int] | None = None) -> int:
        """The launch's longest merge: the most programs one real sequence's keys take, 0 where
        every sequence takes one (its program writes the output itself)."""
        used = self.used_splits(seq_lens, graph)
        longest = int(used.max()) if used.size else 0
        return longest if longest > 1 else 0

    def _pieces(self, lens: np.ndarray, graph: tuple[int, int] | None) -> np.ndarray:
        """[split, sequence]: the keys of each sequence's program at each split (0: unused), in a
        launch of split_count(lens, graph)."""
        if lens.size == 0:
            return lens
        heads, sms = self.num_kv_heads, self.num_sms
        splits = self.split_count(lens, graph)
        pieces = -(-lens // splits)  # the even rule: L / S in whole tiles, or the fair share if longer
        chunk = np.maximum(np.maximum(BLOCK_N, -(-pieces // BLOCK_N) * BLOCK_N),
                           fair_share(int(lens.size), int(lens.sum()), heads, sms))
        used = -(-lens // chunk)
        split = np.arange(int(used.max()))[:, None]
        pieces_at: np.ndarray = np.clip(lens - split * chunk, 0, chunk) * (split < used)
        return pieces_at

    def applies(self, num_seqs: int) -> bool:
        """Whether a decode step of num_seqs real sequences is priced here (module doc: at least two
        programs per SM); below, excess_s is 0 whatever the contexts."""
        return mean_share(num_seqs, self.num_kv_heads, self.num_sms)

    def step_excess_s(self, seq_lens: Sequence[int], seconds_per_token: float,
                      graph: tuple[int, int] | None = None) -> float:
        """What the profiled model adds to a decode step's price: excess_s, less what the profile's
        fit holds of it by the baseline (module doc) for the grid's spread of as many sequences around
        the same mean context: all of its excess_s ("grid_spread"), or what its waves add over every
        program started at once ("grid_waves"); may be < 0."""
        excess = self.excess_s(seq_lens, seconds_per_token, graph)
        lens = _real(seq_lens)
        if self.baseline == "none" or lens.size == 0:
            return excess
        grid = grid_spread_lens(int(lens.size), float(lens.mean())).tolist()
        held = self.excess_s(grid, seconds_per_token, graph)
        if self.baseline == "grid_waves":
            held -= replace(self, resident_per_sm=None).excess_s(grid, seconds_per_token, graph)
        return excess - held

    def excess_s(self, seq_lens: Sequence[int], seconds_per_token: float,
                 graph: tuple[int, int] | None = None) -> float:
        """Seconds the step's attention takes beyond its total context x seconds_per_token (the cost
        model's price of one context token over all layers and this rank's KV heads); >= 0. Zero
        below two programs per SM (module doc). graph: the CUDA graph that runs the step, as
        split_count takes it (None: an eager launch)."""
        heads = self.num_kv_heads
        if seconds_per_token <= 0 or not self.applies(int(_real(seq_lens).size)):
            return 0.0
        bandwidth = heads * self.num_layers / seconds_per_token  # head-keys/s in one layer's pass
        rate = self.program_bandwidth / self.key_bytes  # head-keys/s of one program
        keys = self.programs(seq_lens, graph)
        slots = None if self.resident_per_sm is None else self.resident_per_sm * self.num_sms
        if slots is None or heads * keys.size <= slots:
            # all start together: they finish shortest first
            running = heads * np.arange(keys.size, 0, -1)  # programs still walking while passing keys[i]
            walked = np.diff(keys, prepend=0)  # keys each of them walks in that phase
            fluid = float(np.dot(walked, 1.0 / np.minimum(rate, bandwidth / running)))
        else:
            fluid = walk_seconds(self.launch_order(seq_lens, graph), slots, bandwidth, rate)
        return max(0.0, self.num_layers * (fluid - heads * float(keys.sum()) / bandwidth))


def walk_seconds(keys: np.ndarray, slots: int | None, bandwidth: float, rate: float) -> float:
    """Seconds a launch's programs take (keys: each one's keys, in launch order) when `slots` of
    them run at once (None: all), started in order as slots free, all running ones sharing
    `bandwidth` keys/s and none faster than `rate` keys/s."""
    keys = np.asarray(keys, dtype=float)
    keys = keys[keys > 0]
    if keys.size == 0:
        return 0.0
    if slots is None or keys.size <= slots:
        # all start together: they finish shortest first
        ordered = np.sort(keys)
        running = np.arange(ordered.size, 0, -1)  # programs still walking while passing ordered[i]
        walked = np.diff(ordered, prepend=0.0)
        return float(np.dot(walked, 1.0 / np.minimum(rate, bandwidth / running)))
    # every running program walks at the same speed, so in walked keys the slots are a list
    # schedule: each program starts where the earliest-free slot ends
    starts = list_schedule_starts(keys, slots)
    finishes = starts + keys
    marks = np.unique(np.concatenate((starts, finishes)))
    started = np.searchsorted(np.sort(starts), marks[:-1], side="right")
    finished = np.searchsorted(np.sort(finishes), marks[:-1], side="right")
    running = started - finished  # programs walking between consecutive marks
    return float(np.dot(np.diff(marks), 1.0 / np.minimum(rate, bandwidth / running)))


SCHEDULE_ROUNDS = 32  # list_schedule_starts: vectorised rounds before the rest goes one program at a time


def list_schedule_starts(keys: np.ndarray, slots: int) -> np.ndarray:
    """Where each program starts (in keys walked, keys > 0, launch order, more than `slots` of them)
    when `slots` run at once and each next one takes the slot that frees first. In rounds: the next
    programs take the earliest free ends in order, up to the first whose slot one of those same
    programs would free sooner; what SCHEDULE_ROUNDS leave goes one at a time on a heap. Both give
    the same floats, each a sum of the same walked keys in the same order."""
    starts = np.zeros(keys.size)
    free_at = np.sort(keys[:slots])
    done = slots
    for _ in range(SCHEDULE_ROUNDS):
        if done == keys.size:
            return starts
        block = min(keys.size - done, slots)
        begin = free_at[:block]
        end = begin + keys[done:done + block]
        overtaken = np.flatnonzero(np.minimum.accumulate(end)[:-1] < begin[1:])
        take = block if overtaken.size == 0 else int(overtaken[0]) + 1
        starts[done:done + take] = begin[:take]
        free_at = np.sort(np.concatenate((free_at[take:], end[:take])), kind="stable")  # two sorted runs
        done += take
    ends = free_at.tolist()  # ascending, so already a heap
    later = []
    for walked in keys[done:].tolist():
        later.append(ends[0])
        heapq.heapreplace(ends, ends[0] + walked)
    starts[done:] = later
    return starts


def _real(seq_lens: Sequence[int]) -> np.ndarray:
    lens = np.fromiter(seq_lens, np.int64)
    return lens[lens > 0]
