"""The prefix cache's hits on a Mooncake trace are what its hash_ids promise: with requests far
apart in time (each served before the next arrives) and a cache that keeps everything, every
request reuses exactly the longest run of full cache blocks it shares with an earlier prompt."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config import build_run_config
from harness.run import run_once
from harness.workloads import build_workload
from tests.harness.conftest import compose_config

B = 512
# a request: its hash ids drawn from a small alphabet so that prefixes often agree, and a length
# that may end inside its last block or run past its ids
request = st.tuples(st.lists(st.integers(0, 2), min_size=0, max_size=3), st.integers(1, 4 * B))


def ideal_cached_tokens(prompts: list[list[int]], block: int) -> int:
    """Tokens an unbounded prefix cache of `block`-token blocks hits, in order: a request's full
    blocks (all but its last token, which must be computed) that an earlier prompt began with."""
    seen: set[tuple[int, ...]] = set()
    hits = 0
    for tokens in prompts:
        k = 0
        while (k + 1) * block <= len(tokens) - 1 and tuple(tokens[: (k + 1) * block]) in seen:
            k += 1
        hits += k * block
        seen.update(tuple(tokens[: j * block]) for j in range(1, len(tokens) // block + 1))
    return hits


@settings(max_examples=15, deadline=None)
@given(requests=st.lists(request, min_size=2, max_size=6))
def test_cached_tokens_are_the_shared_blocks(trace_file, requests):
    path = trace_file
    path.write_text("".join(json.dumps({"timestamp": 60_000 * i, "input_length": length, "output_length": 2,
                                        "hash_ids": ids}) + "\n" for i, (ids, length) in enumerate(requests)))
    rc = build_run_config(compose_config(["workload=mooncake", f"workload.trace_path={path}",
                                          "scheduler.max_model_len=4096", "cache.block_size=16"]))
    result = run_once(rc, progress=False)
    served = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size).requests
    prompts = [list(r.prompt_token_ids) for r in sorted(served, key=lambda r: r.arrival_time)]
    assert result.summary["cached_tokens"] == ideal_cached_tokens(prompts, 16)
