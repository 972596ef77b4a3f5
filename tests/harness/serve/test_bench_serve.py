"""experiments/serve/bench_serve.py end to end on CPU: the tiny engine, a few requests."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.serve.bench_serve import main


@pytest.mark.slow
def test_bench_serve_on_the_tiny_cpu_engine(tiny_checkpoint, tmp_path):
    engine = ["backend=engine", "model=tiny-qwen3", "hardware=cpu", "backend.device=cpu",
              f"backend.model={tiny_checkpoint}", "scheduler.max_model_len=256", "cache.block_size=16",
              "cache.num_blocks=128"]
    workload = ["workload.prompt_len.low=16", "workload.prompt_len.high=64", "workload.output_len.low=4",
                "workload.output_len.high=12"]
    assert main(["--out", str(tmp_path), "--capacity", "4", "--loads", "0.5", "--workloads", "poisson",
                 "--num-requests", "4", "--engine", *engine, "--workload", *workload, "--sim", "backend=sim",
                 "model=qwen3-0.6b", "hardware=h100"]) == 0
    frame = pd.read_csv(tmp_path / "serve.csv")
    assert list(frame["source"]) == ["harness_run", "engine_server_client", "engine_server_own", "sim_server_client",
                                     "sim_server_own"]
    assert (frame["requests"] == 4).all()
    assert (frame[["ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms"]] > 0).all().all()
    by = frame.set_index("source")
    assert by.loc["engine_server_client", "ttft_mean_ms"] >= by.loc["engine_server_own", "ttft_mean_ms"] - 1.0
    assert "overhead per request" in (tmp_path / "serve.md").read_text()
