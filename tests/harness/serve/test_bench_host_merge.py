"""bench_serve's serving host (experiments/serve/host.py: the simulator's server priced at the speed
the engine server's launches measure, as the held-out protocol prices a cell) and its merge of an
earlier output (experiments/serve/outputs.py: a stage run alone, the rest kept)."""

from __future__ import annotations

import tarfile

import numpy as np
import pandas as pd
import pytest

from experiments.serve import host, outputs
from experiments.serve.bench_serve import main
from experiments.serve.cases import Case
from sim.step_table import complete_columns

SIM = ["backend=sim", "backend.cost_model=profiled", "model=qwen3-0.6b", "hardware=h100"]


@pytest.fixture(scope="module")
def model():
    return host.profile_model(SIM)


def decode_graph_steps(model, speed: float, seed: int = 0) -> pd.DataFrame:
    """An engine step table of decode graph steps whose launches took `speed` times the profile's
    launch fit, each with a random factor of mean log 0 around it (jitter) but the median kept."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 64, 41)
    rows = pd.DataFrame([{"kind": "decode", "cuda_graph": 1, "num_seqs": n, "num_decode_tokens": n, "num_tokens": n,
                          "num_sampled": n, "num_seeded": 0, "decode_context_tokens": int(n * rng.integers(100, 3000)),
                          "graph_batch_size": n, "num_prefill_tokens": 0, "prefill_context_tokens": 0,
                          "prefill_attention_pairs": 0, "decode_repeated_tokens": 0, "prefill_repeated_tokens": 0,
                          "start": i * 0.01, "duration": 0.002} for i, n in enumerate(sizes)])
    fit = np.array([model.overlap_parts(r)[0] for r in
                    complete_columns(rows.assign(duration_s=rows["duration"])).to_dict("records")])
    factors = np.exp(np.concatenate([[0.0], np.repeat(rng.uniform(0.05, 0.3, 20), 2) * np.tile([1, -1], 20)]))
    return rows.assign(launch_s=speed * fit * factors)


@pytest.mark.parametrize("speed", [0.8, 1.0, 1.76, 2.5])
def test_the_engine_servers_host_is_the_median_launch_ratio(model, speed):
    steps = decode_graph_steps(model, speed, seed=int(speed * 100))
    scale, jitter = host.measured(steps, model)
    assert scale == pytest.approx(speed, rel=1e-9) and jitter > 0
    assert host.sim_host("engine", steps, model) == pytest.approx(speed, rel=1e-9)
    assert host.sim_host("profile", steps, model) == 1.0 and host.sim_host(1.3, steps, model) == 1.3


def test_a_host_that_cannot_be_measured_is_named(model):
    with pytest.raises(RuntimeError, match="no engine server step table"):
        host.sim_host("engine", None, model)
    no_launches = decode_graph_steps(model, 1.5).assign(launch_s=np.nan)
    assert np.isnan(host.measured(no_launches, model)[0])
    with pytest.raises(RuntimeError, match="no decode graph launches"):
        host.sim_host("engine", no_launches, model)
    assert host.profile_model(["backend=sim", "model=qwen3-0.6b", "hardware=h100"]) is None  # roofline


@pytest.mark.parametrize("text, value", [("engine", "engine"), ("profile", "profile"), ("1.5", 1.5)])
def test_sim_host_choices(text, value):
    assert host.parse_choice(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "fast", "inf", ""])
def test_sim_host_refuses_anything_else_naming_the_choices(text):
    with pytest.raises(ValueError, match="--sim-host: engine .* profile .* or a speed > 0"):
        host.parse_choice(text)


def test_a_servers_steps_are_read_from_its_folder_or_its_pack(model, tmp_path):
    steps = decode_graph_steps(model, 1.2)
    assert host.server_steps(tmp_path, "engine_server") is None
    (tmp_path / "engine_server").mkdir()
    steps.to_csv(tmp_path / "engine_server" / "steps.csv.gz", index=False)
    outputs.pack(tmp_path, "engine_server")
    assert not (tmp_path / "engine_server").exists()
    packed = host.server_steps(tmp_path, "engine_server")
    assert packed is not None and host.measured(packed, model)[0] == pytest.approx(1.2)
    with tarfile.open(tmp_path / "other.tar.gz", "w:gz"):
        pass
    assert host.server_steps(tmp_path, "other") is None  # a pack without a step table


def row(source: str, load: float, rate: float, ttft: float = 10.0) -> dict:
    return {"workload": "azure", "load": load, "rate_rps": rate, "source": source, "requests": 4, "ttft_p50_ms": ttft}


@pytest.fixture
def earlier(tmp_path):
    """An earlier output: every stage's rows of two cases, and the packs of the two engine stages."""
    folder = tmp_path / "earlier"
    folder.mkdir()
    rows = [row(source, load, 60 * load, ttft) for load in (0.5, 0.8)
            for source, ttft in (("harness_run", 8.0), ("engine_server_aiperf", 10.0), ("engine_server_own", 9.0),
                                 ("sim_server_aiperf", 11.0), ("sim_server_own", 9.5))]
    pd.DataFrame(rows).to_csv(folder / "serve.csv", index=False)
    pd.DataFrame([{"workload": "azure", "load": load, "server": server, "requests": 4, "overhead_p50_ms": 1.0}
                  for load in (0.5, 0.8) for server in ("engine_server", "sim_server")]).to_csv(
        folder / "overhead.csv", index=False)
    for name in ("harness", "engine_server"):
        (folder / name).mkdir()
        (folder / name / "x.txt").write_text(name)
        outputs.pack(folder, name)
    return folder


def cases(rate: float = 60.0) -> list[Case]:
    return [Case("azure", load, rate * load, [], []) for load in (0.5, 0.8)]


def test_a_merge_keeps_the_stages_not_run_now(earlier, tmp_path):
    kept = outputs.earlier_results(earlier, ["sim"], cases())
    assert sorted(kept) == ["engine", "harness"]
    assert [r["source"] for r in kept["engine"][0]] == ["engine_server_aiperf", "engine_server_own"] * 2
    assert [r["server"] for r in kept["engine"][1]] == ["engine_server"] * 2 and kept["harness"][1] == []
    out = tmp_path / "out"
    out.mkdir()
    assert outputs.copy_packs(earlier, out, ["harness", "engine"]) == ["harness.tar.gz", "engine_server.tar.gz"]
    assert outputs.copy_packs(out, out, ["harness", "engine"]) == []  # the same folder: nothing to copy
    new = {"sim": ([row("sim_server_own", load, 60 * load, 9.9) for load in (0.5, 0.8)], [])}
    frame, _ = outputs.write(out, {**new, **kept})  # written in stage order whatever the dict's
    assert list(frame["source"]) == ["harness_run"] * 2 + ["engine_server_aiperf", "engine_server_own"] * 2 + [
        "sim_server_own"] * 2
    assert list(frame.loc[frame["source"] == "sim_server_own", "ttft_p50_ms"]) == [9.9, 9.9]
    assert outputs.earlier_results(earlier, ["harness", "engine", "sim"], cases()) == {}


def test_a_merge_refuses_other_cases(earlier):
    with pytest.raises(ValueError, match=r"--merge: .* azure 0.5 at 30 req/s is not among this run's"):
        outputs.earlier_results(earlier, ["sim"], cases(rate=61.0))
    with pytest.raises(ValueError, match="azure 0.8"):
        outputs.earlier_results(earlier, ["sim"], cases()[:1])


def test_stage_of_names_each_source():
    assert [outputs.stage_of(s) for s in ("harness_run", "engine_server_own", "engine_server", "sim_server_aiperf")] \
        == ["harness", "engine", "engine", "sim"]
    with pytest.raises(ValueError, match="unknown source"):
        outputs.stage_of("vllm_client")


@pytest.mark.parametrize("argv, words", [
    (["--sim-host", "fast"], "--sim-host: engine"),
    (["--stages", "sim"], "--sim-host engine without the engine stage needs --merge"),
    (["--sim", "backend=sim", "backend.host_scale=2"], "not backend.host_scale"),
])
def test_bench_serve_refuses_bad_host_settings_in_one_line(tmp_path, capsys, argv, words):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path), "--hardware", "h100", *argv])
    assert exit_info.value.code == 2 and words in capsys.readouterr().err


def test_bench_serve_refuses_a_merge_without_tables_or_of_other_cases(earlier, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "o"), "--hardware", "h100", "--merge", str(tmp_path)])
    assert exit_info.value.code == 2 and "has no serve.csv" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # before any stage runs: the cases are planned on the CPU
        main(["--out", str(tmp_path / "o"), "--hardware", "h100", "--workloads", "poisson", "--capacity", "8",
              "--num-requests", "4", "--stages", "sim", "--merge", str(earlier), "--sim-host", "profile"])
    assert "--merge:" in str(exit_info.value.code) and "not among this run's" in str(exit_info.value.code)
    assert not (tmp_path / "o" / "serve.csv").exists()
