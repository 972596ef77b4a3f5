"""A workload's requests made on demand: lengths, times and seeds are arrays; token ids are drawn
when a request is made, so memory follows the requests in flight rather than the trace.

Token ids come from one generator consumed in row order (or, for Mooncake traces, from a pure
function of the row's blocks), so drawing them row range by row range gives exactly the ids of
one draw over all rows: numpy's bounded integer draws continue where the previous call stopped
(tests/harness/test_workload_stream.py checks the lazy ids against the list). Requests are
yielded in arrival order (a stable sort, as the loop sorts a list); rows drawn ahead of their
turn (a trace whose rows are not in time order) wait in a buffer until their turn, unless the
ids are a function of the row (addressable: Mooncake), when rows are drawn in arrival order.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from engine.core import Request, SamplingParams
from engine.core.block_manager import block_keys
from harness.convert import ConfigError

CHUNK_TOKENS = 1 << 20  # token ids drawn per call: a few MB at a time
# What a request costs in memory for the whole run whatever its length: its lengths, time and
# seed here, its record of times and counts (engine.core.records) and its requests.csv row
# (measured: docs/fast_forward.md, "Memory"), rounded up.
BYTES_PER_REQUEST = 600


def check_fits(num_requests: int, what: str | None = None) -> None:
    """A ConfigError, before anything is allocated, when num_requests cannot fit this machine's memory;
    what: the setting that asks for them (default workload.num_requests)."""
    need = num_requests * BYTES_PER_REQUEST
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        what = what or f"workload.num_requests={num_requests}: that many requests"
        raise ConfigError(f"{what} need about {need / 2**30:.1f} GiB "
                          f"({BYTES_PER_REQUEST} bytes each for their records) but this machine has "
                          f"{have / 2**30:.1f} GiB of memory; ask for at most {have // BYTES_PER_REQUEST} requests")


@dataclass
class RequestSource:
    """Row i of the workload is a request if keep[i]: its own tokens (own[i] of them, drawn by
    draw(start_row, stop_row) for a row range, concatenated) follow its group's prefix."""

    arrival: np.ndarray  # float64 seconds
    prompt: np.ndarray  # int64 prompt tokens (prefix included)
    output: np.ndarray  # int64 max_tokens
    group: np.ndarray  # int64 shared-prefix group, -1 for none
    own: np.ndarray  # int64 tokens of each row not from a group prefix
    seeds: np.ndarray  # int64 sampling seeds
    keep: np.ndarray  # bool
    prefixes: list[list[int]]  # each group's prefix ids
    # a fresh drawer, called on consecutive row ranges [a, b): their own ids, concatenated (int64)
    drawer: Callable[[], Callable[[int, int], np.ndarray]]
    pool: np.ndarray  # object array of the ints 0 .. bound - 1: ids share these int objects
    id_offset: int  # row i is request str(i + id_offset)
    temperature: float
    ignore_eos: bool
    addressable: bool = False  # a row's ids do not depend on the rows drawn before it

    def __len__(self) -> int:
        return int(self.keep.sum())

    def in_row_order(self) -> Iterator[Request]:
        """Kept rows' requests in row order (what the workload's list holds)."""
        draw = self.drawer()
        for rows in self._chunks(len(self.keep)):
            yield from (r for _, r in self._make(rows, draw))

    def in_arrival_order(self, block_size: int | None = None, packed: bool = False) -> Iterator[Request]:
        """Kept rows' requests by arrival time (ties in row order), drawing ids on the way.
        block_size: each request comes with the keys of its full prompt blocks of that many tokens
        (Request.block_hashes), hashed from the drawn ids' bytes rather than packed from the list
        by the block manager (engine.core.block_manager.block_keys: the same keys). packed: each
        request's token ids are an array("q") made from the drawn bytes, not a list (the simulator:
        no int object per token; engine.core.request.Request keeps it one)."""
        order = np.argsort(self.arrival, kind="stable")
        order = order[self.keep[order]]
        draw = self.drawer()
        if self.addressable:  # none drawn ahead: a file in reverse time order would hold them all
            for rows in self._runs(order.tolist()):
                yield from (r for _, r in self._make(rows, draw, block_size, packed))
            return
        waiting: dict[int, Request] = {}
        drawn = 0  # rows [0, drawn) have their ids
        chunks = self._chunks(len(self.keep))
        for row in order.tolist():
            while row >= drawn:
                rows = next(chunks)
                waiting.update(self._make(rows, draw, block_size, packed))
                drawn = rows.stop
            yield waiting.pop(row)

    def _chunks(self, n: int) -> Iterator[range]:
        """Row ranges of about CHUNK_TOKENS own tokens each (at least one row)."""
        ends = np.cumsum(self.own)
        start = 0
        while start < n:
            base = int(ends[start - 1]) if start else 0
            stop = int(np.searchsorted(ends, base + CHUNK_TOKENS, side="right"))
            stop = min(max(stop, start + 1), n)
            yield range(start, stop)
            start = stop

    def _runs(self, order: list[int]) -> Iterator[range]:
        """order cut into ranges of consecutive rows of about CHUNK_TOKENS own tokens each."""
        start = last = order[0] if order else 0
        tokens = 0
        for row in order[1:]:
            tokens += int(self.own[last])
            if row != last + 1 or tokens >= CHUNK_TOKENS:
                yield range(start, last + 1)
                start, tokens = row, 0
            last = row
        if order:
            yield range(start, last + 1)

    def _make(self, rows: range, draw: Callable[[int, int], np.ndarray],
              block_size: int | None = None, packed: bool = False) -> Iterator[tuple[int, Request]]:
        ids_drawn = draw(rows.start, rows.stop)
        keys = self._keys(rows, ids_drawn, block_size) if block_size else None
        if packed:
            yield from self._make_packed(rows, ids_drawn, keys)
            return
        # (take: a third faster than [] here; each array freed as soon as it is read, so that the
        # next one reuses its memory rather than fresh pages)
        objects = self.pool.take(ids_drawn)
        del ids_drawn
        flat = objects.tolist()
        del objects
        own = self.own[rows.start : rows.stop].tolist()
        keep, group = self.keep, self.group
        at = 0
        for i, length in zip(rows, own):
            own_ids = flat[at : at + length]
            at += length
            if not keep[i]:
                continue
            g = int(group[i])
            ids = self.prefixes[g][: int(self.prompt[i])] + own_ids if g >= 0 else own_ids
            request = Request(str(i + self.id_offset), ids, self._params(i), arrival_time=float(self.arrival[i]))
            if keys is not None:
                request.block_hashes = keys[i - rows.start]
            yield i, request

    def _make_packed(self, rows: range, ids_drawn: np.ndarray,
                     keys: list[list[int]] | None) -> Iterator[tuple[int, Request]]:
        """_make's requests, each one's token ids an array("q") of its drawn ids' bytes."""
        raw = memoryview(np.ascontiguousarray(ids_drawn, dtype=np.int64)).cast("B")
        del ids_drawn
        at = 0
        for i, length in zip(rows, self.own[rows.start : rows.stop].tolist()):
            start, at = at, at + length
            if not self.keep[i]:
                continue
            ids = array("q")
            g = int(self.group[i])
            if g >= 0:
                ids.extend(self.prefixes[g][: int(self.prompt[i])])
            ids.frombytes(raw[8 * start : 8 * at])
            request = Request(str(i + self.id_offset), ids, self._params(i), arrival_time=float(self.arrival[i]))
            if keys is not None:
                request.block_hashes = keys[i - rows.start]
            yield i, request

    def _params(self, i: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_tokens=int(self.output[i]),
                              ignore_eos=self.ignore_eos, seed=int(self.seeds[i]))

    def _keys(self, rows: range, ids_drawn: np.ndarray, block_size: int) -> list[list[int]]:
        """The keys of each row's full prompt blocks (none for a row not kept), from its ids' bytes."""
        raw = np.ascontiguousarray(ids_drawn, dtype=np.int64).data.cast("B")
        prefixes: dict[int, bytes] = {}
        keys: list[list[int]] = []
        at = 0
        for i, length in zip(rows, self.own[rows.start : rows.stop].tolist()):
            data: bytes | memoryview = raw[8 * at : 8 * (at + length)]
            at += length
            if not self.keep[i]:
                keys.append([])
                continue
            g = int(self.group[i])
            if g >= 0:
                if g not in prefixes:
                    prefixes[g] = np.asarray(self.prefixes[g], dtype=np.int64).tobytes()
                data = prefixes[g][: 8 * min(int(self.prompt[i]), len(self.prefixes[g]))] + data
            keys.append(block_keys(data, block_size))
        return keys
