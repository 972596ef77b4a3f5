"""The KV link's block moves on GPUs (engine.kv_link.BlockMover): gathering a request's blocks for
a send and scattering received ones into the cache never make the host wait for the step on the
device (a long kernel stands in for it), and the blocks are the cache's, bit for bit, even when a
later kernel on the main stream overwrites them; on 2 GPUs a send and a receive over NCCL move
them exactly. Needs CUDA (the last test 2 devices); skipped otherwise."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SLEEP_CYCLES = 2_000_000_000  # about a second of a GPU's clock: far longer than any host call here
HOST_BOUND_S = 0.2


def _cache(device, num_blocks=64):
    gen = torch.Generator(device=device).manual_seed(0)
    # [num_layers, K/V, num_blocks, block_size, kv_heads, head_dim], as engine.runner allocates it
    return torch.randn(4, 2, num_blocks, 16, 2, 64, device=device, generator=gen)


def test_gather_does_not_wait_for_the_step_and_copies_the_blocks_before_their_reuse():
    from engine.kv_link import BlockMover

    device = torch.device("cuda", 0)
    cache, mover = _cache(device), BlockMover(device)
    table = [5, 17, 3, 40, 41]
    want = cache[:, :, table].clone()
    mover.gather(cache, table)  # warm: the pinned and device pools hold blocks of these sizes
    torch.cuda.synchronize(device)
    torch.cuda._sleep(SLEEP_CYCLES)  # the step in flight
    cache[:, :, table] += 1.0  # the step writes the request's KV: the gather must see it
    start = time.perf_counter()
    blocks = mover.gather(cache, table)
    host_s = time.perf_counter() - start
    cache[:, :, table] = -7.0  # a later step reuses the released blocks: ordered after the gather
    torch.cuda.synchronize(device)
    assert host_s < HOST_BOUND_S, f"gather blocked the host for {host_s:.3f} s"
    assert torch.equal(blocks, want + 1.0)


def test_scatter_does_not_wait_and_writes_the_reserved_blocks():
    from engine.kv_link import BlockMover, read_blocks, staging_for

    device = torch.device("cuda", 0)
    cache, mover = _cache(device), BlockMover(device)
    table = [9, 2, 33]
    incoming = staging_for(cache, len(table)).normal_()
    others = [i for i in range(cache.shape[2]) if i not in table]
    untouched = cache[:, :, others].clone()
    mover.scatter(cache[:, :, :].clone(), table, incoming)  # warm, on a copy
    torch.cuda.synchronize(device)
    torch.cuda._sleep(SLEEP_CYCLES)
    start = time.perf_counter()
    mover.scatter(cache, table, incoming)
    host_s = time.perf_counter() - start
    torch.cuda.synchronize(device)
    assert host_s < HOST_BOUND_S, f"scatter blocked the host for {host_s:.3f} s"
    assert torch.equal(read_blocks(cache, table), incoming)
    assert torch.equal(cache[:, :, others], untouched)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_nccl_send_of_gathered_blocks_lands_exactly_and_does_not_block_the_sender():
    """Two ranks of one KV link in two threads of this process, GPU 0 sending to GPU 1 while a
    long kernel runs on GPU 0's main stream: the gather and the send return at once; the
    receiver's scattered blocks equal the sender's."""
    from engine.core.disagg_wall import LinkSpec
    from engine.kv_link import BlockMover, KVLink, read_blocks, staging_for
    from engine.tp.group import free_port

    port, links, errors = free_port(), {}, []
    send_table, recv_table = [1, 30, 7, 8], [60, 2, 11, 12]
    caches = {rank: _cache(torch.device("cuda", rank)) for rank in (0, 1)}
    want = caches[0][:, :, send_table].clone()
    result: dict[str, float] = {}

    def rank_main(rank: int) -> None:
        try:
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            link = links[rank] = KVLink(LinkSpec(rank, 2, port, 60.0), device, 2)
            link.warm_up(1)
            mover = BlockMover(device)
            if rank == 0:
                mover.gather(caches[0], send_table)  # warm
                torch.cuda.synchronize(device)
                torch.cuda._sleep(SLEEP_CYCLES)
                start = time.perf_counter()
                blocks = mover.gather(caches[0], send_table)
                work = mover.send(link, blocks, 1)
                result["host_s"] = time.perf_counter() - start
                while not link.completed(work):
                    time.sleep(1e-3)
            else:
                staging = staging_for(caches[1], len(recv_table))
                work = link.recv(staging, 0)
                while not link.completed(work):
                    time.sleep(1e-3)
                mover.scatter(caches[1], recv_table, staging)
            torch.cuda.synchronize(device)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120.0)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "the transfer did not finish in 120 s"
    assert result["host_s"] < HOST_BOUND_S, f"gather and send blocked the host for {result['host_s']:.3f} s"
    assert torch.equal(read_blocks(caches[1], recv_table).cpu(), want.cpu())
