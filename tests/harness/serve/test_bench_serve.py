"""experiments/serve/bench_serve.py end to end on CPU: the tiny engine, a few requests, every stage."""

from __future__ import annotations

import tarfile

import pandas as pd
import pytest

from experiments.serve.bench_serve import main

ENGINE = ["backend=engine", "model=tiny-qwen3", "hardware=cpu", "backend.device=cpu", "scheduler.max_model_len=256",
          "cache.block_size=16", "cache.num_blocks=128"]
WORKLOAD = ["workload.prompt_len.low=16", "workload.prompt_len.high=64", "workload.output_len.low=4",
            "workload.output_len.high=12"]


@pytest.mark.slow
def test_bench_serve_on_the_tiny_cpu_engine(tiny_checkpoint, tmp_path):
    assert main(["--out", str(tmp_path), "--capacity", "8", "--loads", "0.25,0.5", "--workloads", "poisson",
                 "--num-requests", "6", "--hardware", "h100", "--engine", *ENGINE, f"backend.model={tiny_checkpoint}",
                 "--workload", *WORKLOAD, "--sim-host", "profile"]) == 0  # the CPU engine launches no CUDA graphs
    frame = pd.read_csv(tmp_path / "serve.csv")
    assert list(frame["source"]) == (["harness_run"] * 2 + ["engine_server_client", "engine_server_own"] * 2
                                     + ["sim_server_client", "sim_server_own"] * 2)
    assert (frame["requests"] == 6).all() and list(frame["load"].unique()) == [0.25, 0.5]
    assert (frame[["ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms"]] > 0).all().all()
    by = frame[frame["load"] == 0.5].set_index("source")
    # the server's own TTFT starts after the HTTP side took the request: the client's can't be less
    assert by.loc["engine_server_client", "ttft_mean_ms"] >= by.loc["engine_server_own", "ttft_mean_ms"]
    for source in ("harness_run", "engine_server_own"):  # the same step columns: the engine's recorder in both
        assert (by.loc[source, ["step_period_p50_ms", "step_device_p50_ms"]] > 0).all()
        assert by.loc[source, "step_host_p50_ms"] >= 0
    overhead = pd.read_csv(tmp_path / "overhead.csv")
    assert list(overhead["server"]) == ["engine_server", "engine_server", "sim_server", "sim_server"]
    assert (overhead[["overhead_mean_ms", "per_token_ms", "http_in_mean_ms"]] > 0).all().all()
    # what comes back from a device: at most six files, none in a folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine_server.tar.gz", "harness.tar.gz", "overhead.csv",
                                                           "serve.csv", "serve.md", "sim_server.tar.gz"]
    with tarfile.open(tmp_path / "engine_server.tar.gz") as tar:
        assert len(pd.read_csv(tar.extractfile("engine_server/client_poisson_50.csv"))) == 6
        assert "engine_server/requests.csv" in tar.getnames()
    for name, kept in (("harness", 2), ("engine_server", 1), ("sim_server", 0)):  # the engine's steps come back
        with tarfile.open(tmp_path / f"{name}.tar.gz") as tar:
            tables = [n for n in tar.getnames() if n.endswith("steps.csv.gz")]
            assert len(tables) == kept
            if kept:  # with the features the simulator prices them by
                steps = pd.read_csv(tar.extractfile(tables[0]), compression="gzip")
                assert {"duration", "prefill_attention_pairs", "decode_context_tokens"} <= set(steps.columns)
    text = (tmp_path / "serve.md").read_text()
    assert "Server overhead" in text and "within 10%" in text


@pytest.mark.parametrize("argv, words", [
    (["--workloads", "sharegpt"], "--workloads from"),
    (["--loads", "0"], "--loads"),
    (["--capacity", "azure=4"], "--capacity"),
    (["--num-requests", "1"], "--num-requests"),
    (["--cases", "azure_60"], "--cases: ['azure_60'] not among the cases of --workloads x --loads: azure_50,azure_80"),
    (["--cases", ""], "--cases"),
    (["--sim-loop", "on"], "--sim-loop: off, or four seconds"),
    (["--engine-server", "backend.loop_s=1e-4"], "--engine-server takes serve.* settings"),
])
def test_bench_serve_refuses_bad_settings_in_one_line(tmp_path, capsys, argv, words):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path), "--hardware", "h100", *argv])
    assert exit_info.value.code == 2 and words in capsys.readouterr().err


def test_the_replayed_request_samples_as_the_run_does():
    """The benchmark client's body gives the server the workload's own SamplingParams (seed
    included), so the engine behind the server samples on the path the harness's run takes."""
    from experiments.serve.client import request_body
    from harness.scripting import compose_run_config
    from harness.serve.protocol import CompletionRequest
    from harness.workloads.build import build_workload

    rc = compose_run_config(["workload=poisson", "workload.num_requests=5"])
    for request in build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size).requests:
        body = CompletionRequest(**request_body("m", request))
        assert body.sampling_params(body.max_tokens, ()) == request.sampling_params
        assert body.prompt == request.token_ids[:request.num_prompt_tokens]


def test_aiperf_replays_each_request_body_at_its_time(tmp_path):
    """The JSONL aiperf replays (--fixed-schedule, payload sent verbatim) holds each request's own
    body at its arrival time in ms after the first; every id of the model decodes to a word with
    the word tokenizer the engine's server is given, through the server's own decoder."""
    import json

    from experiments.serve import aiperf
    from experiments.serve.client import request_body
    from harness.scripting import compose_run_config
    from harness.serve.text import load_codec
    from harness.workloads.build import build_workload

    rc = compose_run_config(["workload=poisson", "workload.num_requests=7", "model=qwen3-0.6b"])
    requests = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size).requests
    lines = [json.loads(x) for x in aiperf.write_payloads(tmp_path / "p.jsonl", "m", requests).read_text().splitlines()]
    first = min(r.arrival_time for r in requests)
    assert [line["payload"] for line in lines] == [request_body("m", r) for r in requests]
    assert [line["timestamp"] for line in lines] == pytest.approx([(r.arrival_time - first) * 1e3 for r in requests])
    words, extra = aiperf.server_text(compose_run_config(["backend=engine", "model=qwen3-0.6b"]), tmp_path / "w")
    assert extra == [f"serve.tokenizer={words}"]
    decoder = load_codec("engine", str(words)).decoder()
    ids = [0, 1, 511, 512, 151645, rc.model.vocab_size - 1]
    assert [decoder.add([i]) for i in ids] == ["w0", *[f" w{i}" for i in ids[1:]]]


def test_a_case_without_request_ids_takes_its_rows_by_arrival():
    from experiments.serve.tables import case_requests

    requests = pd.DataFrame({"request_id": list("abcdef"), "arrival": [0.5, 0.1, 3.0, 2.0, 2.5, 9.0]})
    clients = [pd.DataFrame({"ttft_s": [0.1, 0.2]}), pd.DataFrame({"ttft_s": [0.1] * 4})]
    first, second = case_requests(requests, [2, 4], clients)
    assert list(first["request_id"]) == ["b", "a"] and list(second["request_id"]) == ["d", "e", "c", "f"]
    with pytest.raises(RuntimeError, match="recorded 6 requests, the cases sent 5"):
        case_requests(requests, [2, 3], clients[:1] * 2)


def test_bench_serve_refuses_an_aiperf_that_does_not_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path), "--hardware", "h100", "--loadgen", "aiperf", "--aiperf", "/nonexistent/aiperf"])
    assert "--loadgen aiperf: aiperf does not run" in str(exit_info.value.code)
    assert not (tmp_path / "serve.csv").exists()


@pytest.mark.slow
def test_bench_serve_with_aiperf_on_the_tiny_cpu_engine(tiny_checkpoint, tmp_path):
    """The same stages with aiperf replaying the requests (needs LOADGEN_AIPERF, as test_loadgen)."""
    import os

    if not os.environ.get("LOADGEN_AIPERF"):
        pytest.skip("LOADGEN_AIPERF is not set: .ci/run installs aiperf==0.13.0 in a venv of its own")
    assert main(["--out", str(tmp_path), "--capacity", "8", "--loads", "0.5", "--workloads", "poisson",
                 "--num-requests", "6", "--hardware", "h100", "--engine", *ENGINE, f"backend.model={tiny_checkpoint}",
                 "--workload", *WORKLOAD, "--loadgen", "aiperf", "--stages", "engine,sim", "--sim-host", "1.2"]) == 0
    frame = pd.read_csv(tmp_path / "serve.csv").set_index("source")
    assert list(frame.index) == ["engine_server_aiperf", "engine_server_own", "sim_server_aiperf", "sim_server_own"]
    assert (frame["requests"] == 6).all()
    assert (frame[["ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms"]] > 0).all().all()
    for server in ("engine_server", "sim_server"):  # the client's TTFT includes the server's
        assert frame.loc[f"{server}_aiperf", "ttft_mean_ms"] >= frame.loc[f"{server}_own", "ttft_mean_ms"]
    with tarfile.open(tmp_path / "engine_server.tar.gz") as tar:
        names = tar.getnames()
    assert "engine_server/aiperf_poisson_50/profile_export_aiperf.json" in names
    assert not any("word_tokenizer" in name for name in names)  # 151,936 words: made again, never sent back
    text = (tmp_path / "serve.md").read_text()
    assert "engine_server_aiperf" in text and "within 10%" in text


@pytest.mark.slow
def test_the_simulator_stage_alone_finishes_an_earlier_output(tiny_checkpoint, tmp_path):
    """A device call cut short before the simulator's server (its harness and engine stages done)
    is finished by that stage alone, merged with the earlier output; again in place, its rows replaced."""
    common = ["--capacity", "8", "--loads", "0.5", "--workloads", "poisson", "--num-requests", "6", "--hardware",
              "h100", "--engine", *ENGINE, f"backend.model={tiny_checkpoint}", "--workload", *WORKLOAD]
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["--out", str(first), *common, "--stages", "harness,engine"]) == 0
    assert main(["--out", str(second), *common, "--stages", "sim", "--merge", str(first), "--sim-host", "1.5"]) == 0
    frame, earlier = pd.read_csv(second / "serve.csv"), pd.read_csv(first / "serve.csv")
    assert list(frame["source"]) == ["harness_run", "engine_server_client", "engine_server_own", "sim_server_client",
                                     "sim_server_own"]
    pd.testing.assert_frame_equal(frame.iloc[:3][earlier.columns], earlier)  # kept as they were
    assert frame.set_index("source").at["sim_server_own", "host_scale"] == 1.5
    assert list(pd.read_csv(second / "overhead.csv")["server"]) == ["engine_server", "sim_server"]
    assert sorted(p.name for p in second.iterdir()) == ["engine_server.tar.gz", "harness.tar.gz", "overhead.csv",
                                                        "serve.csv", "serve.md", "sim_server.tar.gz"]
    with tarfile.open(second / "sim_server.tar.gz") as tar:  # the simulator's server ran at that host
        assert "- backend.host_scale=1.5" in tar.extractfile("sim_server/.hydra/overrides.yaml").read().decode()
    assert "within 10%" in (second / "serve.md").read_text()
    in_place = ["--stages", "sim", "--merge", str(second), "--sim-host", "profile"]
    assert main(["--out", str(second), *common, *in_place]) == 0
    again = pd.read_csv(second / "serve.csv").set_index("source")
    assert len(again) == 5 and again.at["sim_server_own", "host_scale"] == 1.0


@pytest.mark.slow
def test_bench_serve_runs_only_the_chosen_cases_with_their_own_requests(tiny_checkpoint, tmp_path):
    """--cases poisson_50 of loads 0.25,0.5: that case alone, with the requests and rate it has in the
    full set (workload.seed by its place among the loads, not among the cases kept)."""
    common = ["--capacity", "8", "--loads", "0.25,0.5", "--workloads", "poisson", "--num-requests", "6",
              "--hardware", "h100", "--engine", *ENGINE, f"backend.model={tiny_checkpoint}", "--workload", *WORKLOAD,
              "--sim-host", "profile", "--stages", "harness", "--no-pack"]
    assert main(["--out", str(tmp_path / "one"), *common, "--cases", "poisson_50"]) == 0
    assert main(["--out", str(tmp_path / "all"), *common]) == 0
    one, every = (pd.read_csv(tmp_path / name / "serve.csv") for name in ("one", "all"))
    assert list(one["load"]) == [0.5] and list(every["load"]) == [0.25, 0.5]
    plans = [pd.read_json(tmp_path / name / "harness" / "plan.json") for name in ("one", "all")]
    assert plans[0]["overrides"].iloc[0] == plans[1]["overrides"].iloc[1]  # the same requests, the same rate


def test_the_default_simulator_server_prices_launches_by_a_committed_grids_line():
    from pathlib import Path

    from experiments.serve.split_inputs import LAUNCH_LINE_GRIDS, launch_line_default
    from sim.launch_line import load_launch_line

    for hardware in LAUNCH_LINE_GRIDS:
        (setting,) = launch_line_default(hardware)
        grid = Path(setting.split("=", 1)[1])
        assert setting.startswith("backend.launch_line_grid=") and grid.is_file()
        line = load_launch_line(grid)  # the grid has decode graph launches to fit a line on
        assert len(line.sizes) >= 4 and line.price(64) >= line.price(1) > 0
    assert launch_line_default("a100") == []  # no grid of that GPU: the profile's launch fit
