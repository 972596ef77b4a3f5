"""An independent load generator from the package index (aiperf 0.13.0) against both servers.

aiperf pins pandas<3, which the project's pandas 3 rules out, so it lives in a venv of its own:
.ci/run installs it and exports its executable as LOADGEN_AIPERF (docs/serving.md#load-generators;
the command line is built by experiments/serve/aiperf.py, which the GPU benchmark shares);
without it these tests skip, saying so. Each run lasts BENCH_S seconds of aiperf's own duration
(plus its start and the grace for requests in flight), one against the simulator-backed server at
time_scale=1 and one against the tiny CPU engine, and checks what aiperf reports against the
requests.csv the server writes when it stops. The engine's run is in the slow suite: the default
one serves the engine over HTTP already (test_engine_server) and aiperf against the simulator.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest

from engine.tokenizer_builder import build_tokenizer, save_tokenizer
from experiments.serve import aiperf as loadgen
from harness.serve.process import ServerProcess
from tests.harness.serve.conftest import SIM

BENCH_S = 10
ISL, OSL = 96, 24
# The client's TTFT may exceed the server's by HTTP, streaming and a loaded 2-core box's scheduling;
# it can never be earlier (beyond timer noise). Inter-token latencies agree within ITL_TOL.
TTFT_OVERHEAD_MAX_S = 0.25
ITL_TOL = (0.5, 2.0)


@pytest.fixture(scope="module")
def aiperf() -> list[str]:
    if not os.environ.get(loadgen.ENV_VAR):
        pytest.skip(f"{loadgen.ENV_VAR} is not set: .ci/run installs aiperf==0.13.0 in a venv of its own")
    return loadgen.command()


def run_aiperf(aiperf: list[str], base_url: str, model: str, tokenizer: str, out, concurrency: int) -> dict:
    args = [*loadgen.base_args(base_url, model, tokenizer, out),
            *loadgen.synthetic_args(concurrency, BENCH_S, ISL, OSL)]
    return loadgen.run(aiperf, args, out, BENCH_S + 240)


def check_against_server(report: dict, requests: pd.DataFrame, time_scale: float) -> None:
    served = requests[requests["finish_reason"] == "length"]
    count = report["request_count"]["avg"]
    assert report.get("error_request_count") is None or report["error_request_count"]["avg"] == 0
    assert count >= 10 and count == len(served)  # every request aiperf counts, the server finished
    assert (served["output_tokens"] == OSL).all() and report["output_sequence_length"]["avg"] == OSL
    client_ttft = report["time_to_first_token"]["avg"] / 1e3
    server_ttft = served["ttft"].mean() / time_scale
    assert server_ttft - 0.002 <= client_ttft <= server_ttft + TTFT_OVERHEAD_MAX_S, (client_ttft, server_ttft)
    client_itl = report["inter_token_latency"]["avg"] / 1e3
    server_itl = served["tpot"].mean() / time_scale
    assert ITL_TOL[0] * server_itl <= client_itl <= ITL_TOL[1] * server_itl, (client_itl, server_itl)


def test_aiperf_against_the_simulator_server(aiperf, tmp_path):
    tokenizer = tmp_path / "tokenizer"
    save_tokenizer(build_tokenizer(), tokenizer, 4096)
    with ServerProcess([*SIM, "serve.time_scale=1", "output.plots=false"], tmp_path / "serve") as server:
        report = run_aiperf(aiperf, server.base_url, "qwen3-8b", str(tokenizer), tmp_path / "aiperf", 16)
    check_against_server(report, pd.read_csv(tmp_path / "serve" / "requests.csv"), 1.0)


@pytest.mark.slow
def test_aiperf_against_the_cpu_engine_server(aiperf, tiny_checkpoint, tmp_path):
    overrides = ["model=tiny-qwen3", "hardware=cpu", "backend=engine", "backend.device=cpu",
                 f"backend.model={tiny_checkpoint}", "scheduler.max_model_len=256", "cache.block_size=16",
                 "cache.num_blocks=128", "output.plots=false"]
    with ServerProcess(overrides, tmp_path / "serve") as server:
        report = run_aiperf(aiperf, server.base_url, tiny_checkpoint.name, str(tiny_checkpoint),
                            tmp_path / "aiperf", 4)
    check_against_server(report, pd.read_csv(tmp_path / "serve" / "requests.csv"), 1.0)
