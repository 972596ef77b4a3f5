"""Repeated KV reads: blocks that more than one sequence of a step reads.

A step's attention reads, for each scheduled entry, the KV blocks that cover its context
(block_table[:ceil(context_len / block_size)]). With prefix caching a cache hit is the block
itself, not a copy, so sequences that share a prefix read the same physical blocks: a block that
m sequences of the step read is read m times, once from memory and m - 1 times again (a GPU's L2
serves such repeats). The repeated reads of a step are

    sum over entries of blocks read  -  distinct blocks read

and the cost models price them apart from first reads (sim.features, sim.roofline).

NOTE: only full blocks are shared (a block is offered to the prefix cache once its KV is complete),
and every holder of a shared block reads all of it, so the repeated reads in tokens are
block_size x the repeated reads in blocks, exactly.

step_repeated_reads() counts them from the block manager's reference counts, without walking
block tables in the common case (every request holding blocks is in the step, a decode step);
repeated_block_reads() is the definition, for tables given outright (the profiler's synthetic
steps, tests).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain, compress
from operator import attrgetter

from engine.core.block_manager import BlockManager
from engine.core.plan import ScheduledRequest

_BLOCK_TABLE = attrgetter("block_table")
_IS_DECODE = attrgetter("is_decode")


def repeated_block_reads(tables: Iterable[Sequence[int]]) -> int:
    """Reads of a block after its first, over the blocks each table lists (the blocks read)."""
    tables = list(tables)
    return sum(map(len, tables)) - len(set().union(*tables))


def read_blocks(entry: ScheduledRequest, block_size: int) -> Sequence[int]:
    """The blocks an entry's attention reads: those covering its context after the step."""
    return entry.block_table[:-(-entry.context_len // block_size)]


def step_repeated_reads(scheduled: list[ScheduledRequest], bm: BlockManager,
                        num_decodes: int | None = None) -> tuple[int, int]:
    """(repeated block reads of the whole step, of its decode entries alone), with num_decodes of
    the entries decodes (None: counted here, only where a block has two holders). Call it after
    the step is planned and before any of its requests frees blocks (the scheduler books it
    after), so that every entry still holds its table.

    NOTE: entries' whole tables stand in for the blocks they read. A table may run past what its
    entry reads (a prompt whose later chunks are still to come), but only by fresh blocks that no
    other request holds, which add as much to the total as to the distinct count."""
    if not bm.num_extra_refs:
        return 0, 0  # no block has two holders
    if num_decodes is None:
        num_decodes = sum(map(_IS_DECODE, scheduled))
    num_prefills = len(scheduled) - num_decodes
    if bm.num_holders != len(scheduled):
        # a holder sits out this step: count over the step's own tables
        tables = list(map(_BLOCK_TABLE, scheduled))
        if not num_prefills:
            repeated = repeated_block_reads(tables)
            return repeated, repeated
        decodes = compress(tables, map(_IS_DECODE, scheduled)) if num_decodes else ()
        return repeated_block_reads(tables), repeated_block_reads(decodes)
    # Every holder is in the step: a block of r holders is read r times, r - 1 of them again.
    repeated = bm.num_extra_refs
    if not num_prefills:
        return repeated, repeated
    if not num_decodes:
        return repeated, 0
    # Without the prefill entries, a block of r holders, p of them prefills, is read again
    # max(r - p - 1, 0) times instead of r - 1: min(p, r - 1) fewer. NOTE: prefill entries come
    # last in a step (admissions, after the running requests), so the scan from the end is short.
    refs = bm.ref_counts
    tables = []
    for entry in reversed(scheduled):
        if not entry.is_decode:
            tables.append(entry.block_table)
            if len(tables) == num_prefills:
                break
    if num_prefills == 1:  # p is 1 on each of its blocks: one fewer per block it shares
        fewer = sum(map((1).__lt__, map(refs.__getitem__, tables[0])))
    else:
        counts = Counter(chain.from_iterable(tables))
        fewer = sum(map(min, counts.values(), map((-1).__add__, map(refs.__getitem__, counts))))
    return repeated, repeated - fewer
