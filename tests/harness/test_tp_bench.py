"""nano-vllm's bench on Qwen3-8B, 2 x H200: the simulator must not predict linear TP scaling.

Measured on 2 x H200 (issue 15): TP=1 9,224 output tok/s, TP=2 11,317 (1.23x). The roofline's
prediction is checked for the direction a capacity planner depends on: TP=2 is faster than TP=1
but well short of twice as fast, because the all-reduces and the host's share do not shrink.
"""

from __future__ import annotations

from harness.config import build_run_config
from harness.run import run_once
from tests.harness.conftest import compose_config


def bench(tp: int) -> dict:
    rc = build_run_config(compose_config(["experiment=bench", "model=qwen3-8b", "hardware=h200",
                                          f"execution.tensor_parallel_size={tp}", "output.plots=false"]))
    return run_once(rc, progress=False).summary


def test_tp2_bench_prediction_is_below_twice_tp1():
    one, two = bench(1), bench(2)
    assert one["num_requests"] == two["num_requests"] == 256
    assert one["output_tokens"] == two["output_tokens"]
    speedup = two["output_tok_s"] / one["output_tok_s"]
    assert 1.0 < speedup < 1.9, speedup
