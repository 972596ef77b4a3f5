"""A request's KV moved over the KV link (engine.kv_link, gloo, float32) lands in the decode
engine's cache, at the block ids reserved there, as exactly the KV that engine computes itself
from the same prompt: the prefill engine's blocks, bit for bit, in the receiver's layout."""

from __future__ import annotations

import threading

import pytest

from engine.config import EngineConfig
from engine.core import CacheConfig, Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.disagg import PrefillReplica, prefill_copy
from engine.core.disagg_wall import LinkSpec
from engine.core.loop import WallClock

torch = pytest.importorskip("torch")

SCHEDULER = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256)
# no prefix cache: the same prompt allocated twice on one engine takes other blocks
CACHE = CacheConfig(block_size=16, num_blocks=48, enable_prefix_caching=False)
PROMPT = [(7 * i + 3) % 200 + 1 for i in range(77)]  # 4 full blocks and 13 tokens


def _prefill(replica: PrefillReplica, rid: str, prompt: list[int]) -> list[int]:
    """The request prefilled on the replica; its held block table."""
    replica.inbox.append(prefill_copy(Request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=4))))
    while replica.next_event_time() < float("inf"):
        replica.tick()
    return replica.holding.held[rid]


def _prompt_kv(cache, table: list[int], num_tokens: int):
    """[layers, K/V, num_tokens, kv_heads, head_dim]: the prompt's slots of its blocks."""
    from engine.kv_link import read_blocks

    blocks = read_blocks(cache, table)
    return blocks.flatten(2, 3)[:, :, :num_tokens]


def _links(port: int):
    from engine.kv_link import KVLink

    links: dict[int, object] = {}

    def make(rank: int) -> None:
        links[rank] = KVLink(LinkSpec(rank, 2, port, 60.0), torch.device("cpu"), 2)

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    return links[0], links[1]


def test_moved_blocks_equal_the_receivers_own_prefill_of_the_prompt(tiny_qwen3_dir):
    from engine.executor import EngineExecutor
    from engine.kv_link import BlockMover, StagingPool
    from engine.tp.group import free_port

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cpu", dtype="float32")
    sender, receiver = EngineExecutor(config, SCHEDULER, CACHE), EngineExecutor(config, SCHEDULER, CACHE)
    try:
        a = PrefillReplica(0, make_scheduler(SCHEDULER, sender.info(), CACHE), sender, WallClock())
        b = PrefillReplica(1, make_scheduler(SCHEDULER, receiver.info(), CACHE), receiver, WallClock())
        _prefill(b, "other", PROMPT[:40])  # the receiver's blocks for the prompt start elsewhere
        sent_table, own_table = _prefill(a, "r", PROMPT), _prefill(b, "r", PROMPT)
        # blocks reserved for the incoming KV, as a decode replica reserves them (fresh ids)
        incoming = Request("r-in", PROMPT, SamplingParams(max_tokens=4))
        b.scheduler.block_manager.allocate(incoming, len(PROMPT))
        target = incoming.block_table
        assert len({*sent_table}) == len(target) == 5 and not {*target} & {*own_table}
        cache_a, cache_b = sender.runner.kv_cache, receiver.runner.kv_cache
        send_link, recv_link = _links(free_port())
        mover = BlockMover(torch.device("cpu"))
        blocks = mover.gather(cache_a, sent_table)
        # received into a decode replica's staging pool, behind another transfer in flight from
        # the same peer (peer 1 of 2: the pool's second ring), which it must leave untouched
        pool = StagingPool(cache_b, 2, 8)
        decoy = pool.take(1, 3).fill_(-7.0)
        staging = pool.take(1, len(target))
        assert staging.shape == (cache_b.shape[0], 2, len(target), *cache_b.shape[3:]) and staging.is_contiguous()
        assert not pool.fits(1, 1)
        works = {}
        threads = [threading.Thread(target=lambda: works.setdefault("send", mover.send(send_link, blocks, 1).wait())),
                   threading.Thread(target=lambda: works.setdefault("recv", recv_link.recv(staging, 0).wait()))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60.0)
        assert set(works) == {"send", "recv"}
        mover.scatter(cache_b, target, staging)
        assert bool((decoy == -7.0).all())
        moved = _prompt_kv(cache_b, target, len(PROMPT))
        assert torch.equal(moved, _prompt_kv(cache_a, sent_table, len(PROMPT)))
        assert torch.equal(moved, _prompt_kv(cache_b, own_table, len(PROMPT)))
        assert moved.abs().sum() > 0  # a prefill wrote something: not two empty caches agreeing
    finally:
        sender.shutdown()
        receiver.shutdown()


def _tp2_link(executor, replica: int):
    """Rank 0's end of a TP 2 replica's link, its worker joined too (as engine.replica_main does)."""
    from engine.kv_link import KVLink

    spec = LinkSpec(replica, 2, PORT_OF[0], 60.0, tps=(2, 2))
    executor.workers.send("kv_link", (spec, 1))
    link = KVLink(spec, torch.device("cpu"), executor.runner.shape.num_kv_heads)
    link.warm_up(1)
    executor.workers.replies("kv_link")
    return link


PORT_OF: list[int] = []  # the link's port, set in each process before _tp2_link


def _tp2_config(model_dir: str) -> EngineConfig:
    from engine.core.config import ExecutionConfig

    return EngineConfig(model=model_dir, device="cpu", dtype="float32",
                        execution=ExecutionConfig(tensor_parallel_size=2))


def _worker_prompt_kv(executor, table: list[int]):
    """Rank 1's prompt slots of the blocks, as its next step would read them."""
    executor.workers.send("kv_read", table)
    return executor.workers.replies("kv_read")[0].flatten(2, 3)[:, :, :len(PROMPT)]


def _tp2_sender(model_dir: str, port: int, conn) -> None:
    """A child process (one TP engine a process): a TP 2 engine prefills PROMPT and sends its
    blocks to replica 1, rank 0 forwarding the move to its worker; returns both ranks' prompt KV."""
    from engine.executor import EngineExecutor
    from engine.kv_link import BlockMover

    PORT_OF.append(port)
    executor = EngineExecutor(_tp2_config(model_dir), SCHEDULER, CACHE)
    try:
        table = _prefill(PrefillReplica(0, make_scheduler(SCHEDULER, executor.info(), CACHE), executor, WallClock()),
                         "r", PROMPT)
        link = _tp2_link(executor, 0)
        mover = BlockMover(torch.device("cpu"))
        work = mover.send(link, mover.gather(executor.runner.kv_cache, table), 1)
        executor.workers.send("kv_send", (table, 1))
        work.wait()
        conn.send((_prompt_kv(executor.runner.kv_cache, table, len(PROMPT)), _worker_prompt_kv(executor, table)))
    finally:
        executor.shutdown()


@pytest.mark.slow
def test_each_tp_rank_moves_its_own_shard_to_the_same_rank_of_the_receiver(tiny_qwen3_dir):
    """TP 2 engines, the sender in a child process (rank 1 a worker process of each): rank 0's
    move forwarded to its worker (as engine.disagg_replica does) lands each rank's shard at the
    receiver's reserved blocks, equal to the sender's and to the receiver's own prefill of the
    prompt on that rank."""
    import multiprocessing as mp

    from engine.executor import EngineExecutor
    from engine.kv_link import BlockMover, staging_for
    from engine.tp.group import free_port

    port = free_port()
    PORT_OF[:] = [port]
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    sender = ctx.Process(target=_tp2_sender, args=(str(tiny_qwen3_dir), port, child))
    sender.start()
    receiver = EngineExecutor(_tp2_config(str(tiny_qwen3_dir)), SCHEDULER, CACHE)
    try:
        b = PrefillReplica(1, make_scheduler(SCHEDULER, receiver.info(), CACHE), receiver, WallClock())
        _prefill(b, "other", PROMPT[:40])
        own_table = _prefill(b, "r", PROMPT)
        incoming = Request("r-in", PROMPT, SamplingParams(max_tokens=4))
        b.scheduler.block_manager.allocate(incoming, len(PROMPT))
        target = incoming.block_table
        link = _tp2_link(receiver, 1)
        staging = staging_for(receiver.runner.kv_cache, len(target))
        work = link.recv(staging, 0)
        receiver.workers.send("kv_recv", (list(target), 0))
        work.wait()
        BlockMover(torch.device("cpu")).scatter(receiver.runner.kv_cache, target, staging)
        assert parent.poll(120.0), "the sender sent nothing in 120 s"
        sent = parent.recv()
        moved = (_prompt_kv(receiver.runner.kv_cache, target, len(PROMPT)), _worker_prompt_kv(receiver, target))
        own = (_prompt_kv(receiver.runner.kv_cache, own_table, len(PROMPT)), _worker_prompt_kv(receiver, own_table))
        for rank in (0, 1):
            assert torch.equal(moved[rank], sent[rank]) and torch.equal(moved[rank], own[rank]), f"TP rank {rank}"
            assert moved[rank].abs().sum() > 0
        assert not torch.equal(moved[0], moved[1])  # two shards (other KV heads), not one copied twice
    finally:
        receiver.shutdown()
        sender.join(60.0)
        if sender.is_alive():
            sender.terminate()
