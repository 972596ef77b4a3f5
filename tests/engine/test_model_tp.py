"""Tensor parallelism without GPUs: each rank runs in a thread, collectives through shared memory.

The sharded model must give the unsharded model's logits, prefill and decode, including tp_size
larger than the number of kv heads (kv heads replicated).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from engine.attention import make_metadata, slot_mapping_for
from engine.loader import load_model


class ThreadGroup:
    """all_reduce / all_gather among `size` threads; every rank combines in rank order."""

    def __init__(self, size: int):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * size

    def _exchange(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = x
        self.barrier.wait()
        parts = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return parts

    def collectives(self, rank: int):
        return (
            lambda x: torch.stack(self._exchange(rank, x)).sum(0),
            lambda x: torch.cat(self._exchange(rank, x), dim=-1),
        )


def _run(model_dir, tp_rank: int = 0, tp_size: int = 1, group: ThreadGroup | None = None, **load_kw):
    torch.set_num_threads(1)
    reduce, gather = group.collectives(tp_rank) if group else (None, None)
    model, _ = load_model(model_dir, tp_rank=tp_rank, tp_size=tp_size, all_reduce=reduce, all_gather=gather,
                          **load_kw)
    caches = model.make_kv_caches(16, 4)
    prompts = [[5, 17, 300, 42, 9, 8, 77], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    tables = [[0, 1], [2, 3, 4]]
    out = []
    with torch.no_grad():
        # prefill both, then one decode step each
        meta = make_metadata(
            [len(p) for p in prompts], [len(p) for p in prompts], tables,
            np.concatenate([slot_mapping_for(t, 0, len(p), 4) for t, p in zip(tables, prompts)]),
        )
        ids = torch.tensor(prompts[0] + prompts[1])
        pos = torch.tensor(list(range(len(prompts[0]))) + list(range(len(prompts[1]))))
        out.append(model.compute_logits(model(ids, pos, caches, meta)))
        meta = make_metadata(
            [1, 1], [len(p) + 1 for p in prompts], tables,
            np.concatenate([slot_mapping_for(t, len(p), len(p) + 1, 4) for t, p in zip(tables, prompts)]),
        )
        out.append(model.compute_logits(model(torch.tensor([100, 200]), torch.tensor([7, 11]), caches, meta)))
    return out, model


def run_on_threads(model_dir, size: int, **load_kw) -> list:
    """_run on every rank of a ThreadGroup of size threads: each rank's (logits, model), rank order."""
    group = ThreadGroup(size)
    results: list = [None] * size
    errors: list[BaseException] = []

    def worker(rank: int) -> None:
        try:
            results[rank] = _run(model_dir, rank, size, group, **load_kw)
        except BaseException as e:  # surfaced below; a dead rank would otherwise hang the barrier
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("model_fixture", ["tiny_qwen3_dir", "tiny_qwen2_dir", "tiny_qwen3_moe_dir"])
@pytest.mark.parametrize("tp_size", [2, 4])
def test_sharded_model_matches_unsharded(request, model_fixture, tp_size):
    model_dir = request.getfixturevalue(model_fixture)
    want, full = _run(model_dir)
    for got, model in run_on_threads(model_dir, tp_size):
        assert model.num_kv_heads == max(1, full.num_kv_heads // tp_size)
        assert model.lm_head.weight.shape[0] == full.lm_head.weight.shape[0] // tp_size
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
