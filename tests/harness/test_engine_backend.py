"""backend=engine through the harness: the tiny CPU engine writes the same tables, same schedule as the sim."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.config import build_run_config
from harness.run import run_once
from tests.harness.conftest import compose_config

pytest.importorskip("torch")

STEP_DECISIONS = ["kind", "requests", "prefill_tokens", "decode_tokens", "waiting", "running", "free_blocks",
                  "preempted", "prefix_hit_tokens", "repeated_kv_tokens"]


def test_engine_and_sim_runs_share_the_schedule(tiny_checkpoint):
    # Small blocks and a small cache so that the offline batch preempts. Steps run one at a time on
    # both sides (the engine on CPU cannot overlap them), so the queue snapshots agree too.
    common = ["execution.async_scheduling=false", "model=tiny-qwen3", "workload.num_requests=12",
              "workload.prompt_len.high=160", "workload.output_len.high=48", "workload.output_len.low=8",
              "scheduler.max_model_len=512", "cache.block_size=16", "cache.num_blocks=40"]
    engine_rc = build_run_config(compose_config(common + ["backend=engine", f"backend.model={tiny_checkpoint}",
                                                          "backend.device=cpu"]))
    sim_rc = build_run_config(compose_config(common))
    engine = run_once(engine_rc, progress=False)
    sim = run_once(sim_rc, progress=False)
    assert engine.summary["backend"] == "engine" and engine.summary["num_requests"] == 12
    assert engine.summary["preemptions"] > 0
    pd.testing.assert_frame_equal(engine.steps[STEP_DECISIONS], sim.steps[STEP_DECISIONS])
    assert list(engine.requests.columns) == list(sim.requests.columns)
    assert (engine.requests["ttft"] <= engine.requests["e2e"]).all()


def test_engine_and_sim_count_the_same_repeated_reads_of_shared_prefixes(tiny_checkpoint):
    common = ["execution.async_scheduling=false", "model=tiny-qwen3", "workload=shared_prefix",
              "workload.arrival=offline", "workload.rate=null",
              "workload.num_requests=10", "workload.prompt_len.low=8", "workload.prompt_len.high=40",
              "workload.output_len.low=8", "workload.output_len.high=24", "workload.shared_prefix.num_groups=2",
              "workload.shared_prefix.prefix_len=64", "scheduler.max_model_len=512",
              "scheduler.max_num_batched_tokens=80", "scheduler.max_num_seqs=8",
              "cache.block_size=16", "cache.num_blocks=250"]
    engine = run_once(build_run_config(compose_config(common + [
        "backend=engine", f"backend.model={tiny_checkpoint}", "backend.device=cpu"])), progress=False)
    sim = run_once(build_run_config(compose_config(common)), progress=False)
    pd.testing.assert_frame_equal(engine.steps[STEP_DECISIONS], sim.steps[STEP_DECISIONS])
    assert engine.steps["repeated_kv_tokens"].sum() > 0
