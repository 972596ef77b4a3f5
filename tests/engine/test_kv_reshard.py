"""KV moved between replicas of two TP sizes over the KV link (engine.kv_link, gloo, one thread a
TP rank): each decode rank's cache ends up holding exactly its own KV heads of the prefill
replica's blocks, at its reserved block ids, whichever ranks sent them (engine.core.kv_heads)."""

from __future__ import annotations

import threading
import time

import pytest

from engine.core.disagg_wall import LinkSpec
from engine.core.kv_heads import kv_heads_held

torch = pytest.importorskip("torch")

LAYERS, NUM_BLOCKS, BLOCK_SIZE, HEAD_DIM = 2, 8, 4, 8
SEND_TABLE = [5, 0, 3]
RECV_TABLES = [[1, 6, 2], [7, 4, 0]]  # per decode replica: the blocks it reserved


# A link's port is picked free and bound a moment later by its first rank; under pytest-xdist
# another worker's gloo pair can take it in between, and the mesh then fails to connect. Such a
# set-up failure is the machine's, not the head plan's: the link is built again on a fresh port.
SETUP_ATTEMPTS = 3


def _run(num_kv_heads: int, tps: tuple[int, ...], device=lambda link_rank: torch.device("cpu")):
    for _ in range(SETUP_ATTEMPTS - 1):
        try:
            return _run_once(num_kv_heads, tps, device)
        except _LinkSetupFailed:
            pass
    return _run_once(num_kv_heads, tps, device)  # the last attempt's set-up failure fails the test


class _LinkSetupFailed(Exception):
    pass


def _run_once(num_kv_heads: int, tps: tuple[int, ...], device):
    """Replica 0 prefills (its blocks: one model-wide cache cut into its ranks' shards) and sends
    the request to every decode replica; returns the model-wide KV and each decode rank's cache
    (on the CPU). device: each link rank's device (CUDA: NCCL, one GPU a rank)."""
    from engine.kv_link import BlockMover, KVLink, staging_for
    from engine.tp.group import free_port

    gen = torch.Generator().manual_seed(sum(tps) * 10 + num_kv_heads)
    full = torch.randn(LAYERS, 2, NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, HEAD_DIM, generator=gen)
    port, caches, sent, errors = free_port(), {}, {}, []

    def rank_main(replica: int, tp_rank: int) -> None:
        try:
            spec = LinkSpec(replica, len(tps), port, 60.0, tps, tp_rank)
            on = device(spec.link_rank(replica, tp_rank))
            if on.type == "cuda":
                torch.cuda.set_device(on)
            try:
                link = KVLink(spec, on, num_kv_heads)
            except RuntimeError as error:  # the store or the mesh did not connect
                raise _LinkSetupFailed(error) from error
            link.warm_up(1)
            mover = BlockMover(on)
            held = kv_heads_held(num_kv_heads, tps[replica], tp_rank)
            if replica == 0:
                blocks = mover.gather(full[..., held.start:held.stop, :].contiguous().to(on), SEND_TABLE)
                moves = [mover.send(link, blocks, dst) for dst in range(1, len(tps))]
                sent[tp_rank] = [link.request_bytes(blocks, dst) for dst in range(1, len(tps))]
                for move in moves:
                    while not link.completed(move):
                        time.sleep(1e-3)
                return
            cache = torch.zeros(LAYERS, 2, NUM_BLOCKS, BLOCK_SIZE, len(held), HEAD_DIM, device=on)
            staging = staging_for(cache, len(SEND_TABLE))
            move = link.recv(staging, 0)
            while not link.completed(move):
                time.sleep(1e-3)
            mover.scatter(cache, RECV_TABLES[replica - 1], staging)
            caches[replica, tp_rank] = cache.cpu()
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=rank_main, args=(replica, r)) for replica, tp in enumerate(tps)
               for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    if errors and all(isinstance(error, _LinkSetupFailed) for error in errors):
        raise _LinkSetupFailed(errors)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a transfer did not finish in 60 s"
    return full, caches, sent


CASES = [
    (2, (1, 2)),  # one prefill rank splits its heads between two decode ranks
    (2, (2, 1)),  # two prefill ranks' shards joined on one decode rank
    (2, (2, 2)),  # one size: rank to same rank, as before two sizes were allowed
    (2, (4, 1)),  # replicated heads on the prefill side: one replica of each sends
    (2, (1, 4)),  # replicated heads on the decode side: every replica receives its head
    (1, (2, 3)),  # one head on 2 prefill ranks, replicated on 3 decode ranks
    (4, (2, 1, 4)),  # one prefill replica, two decode replicas of other sizes
]
GPU_CASES = [(2, (1, 2)), (2, (2, 1)), (1, (1, 3)), (1, (2, 1)), (2, (2, 2)), (4, (1, 2, 1)), (1, (2, 3))]


@pytest.mark.parametrize("num_kv_heads, tps", CASES)
def test_each_decode_rank_holds_exactly_its_heads_of_the_prefill_blocks(num_kv_heads, tps):
    _check(num_kv_heads, tps, *_run(num_kv_heads, tps))


@pytest.mark.gpu
@pytest.mark.parametrize("num_kv_heads, tps", GPU_CASES)
def test_nccl_moves_each_decode_ranks_heads_one_gpu_a_rank(num_kv_heads, tps):
    """The same over NCCL, every link rank on its own GPU (needs sum(tps) of them)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < sum(tps):
        pytest.skip(f"needs {sum(tps)} CUDA devices")
    _check(num_kv_heads, tps, *_run(num_kv_heads, tps, lambda link_rank: torch.device("cuda", link_rank)))


def _check(num_kv_heads, tps, full, caches, sent) -> None:
    for (replica, tp_rank), cache in caches.items():
        held = kv_heads_held(num_kv_heads, tps[replica], tp_rank)
        table = RECV_TABLES[replica - 1]
        want = full[:, :, SEND_TABLE][..., held.start:held.stop, :]
        assert torch.equal(cache[:, :, table], want), (replica, tp_rank)
        others = [b for b in range(NUM_BLOCKS) if b not in table]
        assert not cache[:, :, others].any()  # nothing written outside the reserved blocks
    assert len(caches) == sum(tps[1:])
    # every rank reports the bytes of the whole request: each decode rank's heads, replicas included
    per_head = LAYERS * 2 * len(SEND_TABLE) * BLOCK_SIZE * HEAD_DIM * 4
    for rank_bytes in sent.values():
        assert rank_bytes == [per_head * tp * max(1, num_kv_heads // tp) for tp in tps[1:]]
