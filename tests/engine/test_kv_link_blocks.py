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
        links[rank] = KVLink(LinkSpec(rank, 2, port, 60.0), torch.device("cpu"))

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    return links[0], links[1]


def test_moved_blocks_equal_the_receivers_own_prefill_of_the_prompt(tiny_qwen3_dir):
    from engine.executor import EngineExecutor
    from engine.kv_link import BlockMover, staging_for
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
        staging = staging_for(cache_b, len(target))
        works = {}
        threads = [threading.Thread(target=lambda: works.setdefault("send", mover.send(send_link, blocks, 1).wait())),
                   threading.Thread(target=lambda: works.setdefault("recv", recv_link.recv(staging, 0).wait()))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60.0)
        assert set(works) == {"send", "recv"}
        mover.scatter(cache_b, target, staging)
        moved = _prompt_kv(cache_b, target, len(PROMPT))
        assert torch.equal(moved, _prompt_kv(cache_a, sent_table, len(PROMPT)))
        assert torch.equal(moved, _prompt_kv(cache_b, own_table, len(PROMPT)))
        assert moved.abs().sum() > 0  # a prefill wrote something: not two empty caches agreeing
    finally:
        sender.shutdown()
        receiver.shutdown()
