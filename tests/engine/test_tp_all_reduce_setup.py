"""DistGroup's choice of all-reduce (engine.tp.group): every rank takes the same path.

The one-shot kernel needs CUDA; the agreement around its setup does not. Two gloo ranks run
DistGroup._symmetric with engine.tp.symmetric's two halves replaced (every case in one pair of
processes, each in a group of its own): where one rank cannot allocate, no rank may enter the
(collective) connect step, "auto" falls back to NCCL on both and "symmetric" fails on both with a
one-line reason; where all allocate and connect, both use it.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.multiprocessing as mp

from engine.tp.group import DistGroup, free_port

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")


class _Reducer:
    pass


# (failing rank, mode) of each case; -1: every rank allocates
CASES = {"one_fails_auto": (1, "auto"), "one_fails_symmetric": (0, "symmetric"), "all_allocate": (-1, "auto")}


def _rank(rank: int, ports: list[int], results) -> None:
    """Every case in turn on this rank, each in a group of its own (a fresh port), so that the
    cases share one pair of spawned processes (a spawn costs seconds: it imports torch)."""
    import engine.tp.symmetric as symmetric

    for (name, (failing_rank, mode)), port in zip(CASES.items(), ports):
        group = DistGroup(rank, 2, port, torch.device("cpu"), 30.0)
        connected = []

        def allocate(rank_, world, device, port, failing_rank=failing_rank):
            if rank_ == failing_rank:
                raise RuntimeError("symmetric memory unavailable: no peer mapping here")
            return ("allocated", port)

        def connect(rank_, world, allocated, connected=connected):
            connected.append(allocated)
            return _Reducer()

        symmetric.SymmetricAllReduce.allocate = staticmethod(allocate)
        symmetric.SymmetricAllReduce.connect = staticmethod(connect)
        try:
            outcome = "reducer" if isinstance(group._symmetric(mode), _Reducer) else "nccl"
        except RuntimeError as error:
            outcome = f"error: {error}"
        finally:
            group.destroy()
        results.put((name, rank, outcome, connected))


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[int, tuple[str, list]]]:
    """{case: {rank: (outcome, what connect() was given)}} of two gloo ranks."""
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    ports: list[int] = []
    while len(ports) < len(CASES):
        ports = sorted({*ports, free_port()})
    procs = [ctx.Process(target=_rank, args=(r, ports, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got: dict[str, dict[int, tuple[str, list]]] = {name: {} for name in CASES}
    for _ in range(len(CASES) * len(procs)):
        name, rank, outcome, connected = results.get()
        got[name][rank] = (outcome, connected)
    return got


def test_one_rank_failing_to_allocate_keeps_every_rank_out_of_the_rendezvous(outcomes):
    got = outcomes["one_fails_auto"]
    assert got[0] == ("nccl", []) and got[1] == ("nccl", [])


def test_symmetric_mode_fails_on_every_rank_with_the_reason(outcomes):
    got = outcomes["one_fails_symmetric"]
    assert got[0][0].startswith("error: all_reduce='symmetric' cannot run on rank 0: symmetric memory unavailable")
    assert got[1][0] == "error: all_reduce='symmetric' cannot run on rank 1: another rank failed"
    assert got[0][1] == got[1][1] == []


def test_every_rank_connects_under_one_name_when_all_can(outcomes):
    got = outcomes["all_allocate"]
    assert got[0][0] == got[1][0] == "reducer"
    assert got[0][1] == got[1][1] and len(got[0][1]) == 1


def test_a_process_that_set_up_one_engine_refuses_a_second_before_any_rendezvous(monkeypatch):
    """torch numbers its rendezvous exchanges per process: rank 0 lives on in the caller's process
    while each engine's workers start afresh, so a second rendezvous would never meet. The refusal
    comes from allocate(), before any collective, so DistGroup's agreement turns it into NCCL."""
    symm_mem = pytest.importorskip("torch.distributed._symmetric_memory")
    from engine.tp.symmetric import GROUP_PREFIX, SymmetricAllReduce

    monkeypatch.setattr(symm_mem, "_group_name_to_store", {"0": None, f"{GROUP_PREFIX}41000": None})
    with pytest.raises(RuntimeError, match="an earlier tensor-parallel engine in this process set up symmetric memory"):
        SymmetricAllReduce.allocate(0, 2, torch.device("cpu"), 41001)


def test_allocate_without_triton_is_a_reason_for_nccl(monkeypatch):
    """The kernel is Triton's (the gpu extra): where it does not import, allocate() says so as the
    RuntimeError that DistGroup turns into NCCL, before any buffer or collective."""
    symm_mem = pytest.importorskip("torch.distributed._symmetric_memory")
    from engine.tp.symmetric import SymmetricAllReduce

    monkeypatch.setattr(symm_mem, "_group_name_to_store", {})
    monkeypatch.setitem(sys.modules, "kernels.all_reduce", None)  # importing it raises ImportError
    with pytest.raises(RuntimeError, match="the one-shot all-reduce needs Triton"):
        SymmetricAllReduce.allocate(0, 2, torch.device("cpu"), 41002)
