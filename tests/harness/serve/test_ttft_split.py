"""experiments/serve/ttft_split.py on a benchmark output the simulator made itself: both "servers"
are the simulator's own run with known HTTP terms added, so the split must find those terms, the
simulation at each server's arrivals must give its own TTFT back, and the prediction-only figures
must equal the engine server's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from experiments.serve import ttft_split
from harness.run import run_once
from harness.scripting import compose_run_config
from tests.harness.serve.test_step_prices import mooncake_bench_folder

HTTP_IN, OUT, RESIDUAL = 5e-4, 3e-4, 1e-3  # seconds: what each "server" and its client add


def served(frame: pd.DataFrame) -> pd.DataFrame:
    """A server's requests.csv: the run's rows with the HTTP columns, on the run's clock."""
    http_arrival = frame["arrival"] - HTTP_IN
    return frame.assign(http_arrival=http_arrival, http_in=HTTP_IN, first_token_out=OUT,
                        http_ttft=HTTP_IN + frame["ttft"] + OUT)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    overrides = mooncake_bench_folder(folder)
    run = run_once(compose_run_config([*ttft_split.SIM, *overrides]), progress=False).requests
    rows = served(run)
    client = RESIDUAL + rows["http_ttft"]
    for server in ttft_split.SERVERS:
        (folder / server).mkdir()
        rows.to_csv(folder / server / "requests.csv", index=False)
    # the in-repo client's records name the server's ids; aiperf's give the token counts and the start
    pd.DataFrame({"request_id": rows["request_id"], "ttft_s": client, "itl_s": rows["tpot"]}).to_csv(
        folder / "engine_server" / "client_mooncake_50.csv", index=False)
    (folder / "sim_server" / "aiperf_mooncake_50").mkdir()
    with open(folder / "sim_server" / "aiperf_mooncake_50" / "profile_export.jsonl", "w") as f:
        for row in rows.sample(frac=1, random_state=0).itertuples():  # in no particular order
            metrics = {"time_to_first_token": {"value": (RESIDUAL + row.http_ttft) * 1e3},
                       "inter_token_latency": {"value": row.tpot * 1e3},
                       "usage_prompt_tokens": {"value": row.prompt_tokens},
                       "output_sequence_length": {"value": row.output_tokens}}
            f.write(json.dumps({"metadata": {"request_start_ns": int(row.http_arrival * 1e9)},
                                "metrics": metrics}) + "\n")
    return folder


def test_the_split_finds_the_terms_and_the_simulation_its_own_run(out, tmp_path):
    folders = ttft_split.unpack(out, tmp_path)
    requests = pd.read_csv(folders["engine_server"] / "requests.csv")
    rows = {server: ttft_split.joined(ttft_split.client_records(folders[server], "mooncake_50"), requests)
            for server in ttft_split.SERVERS}
    overrides = ttft_split.case_overrides(folders["harness"], "mooncake_50")
    split, core, client, parts = ttft_split.case_tables(overrides, rows)
    assert parts.empty  # no harness run: no split of the miss
    assert np.allclose(split[["http_in", "first_token_out", "residual"]].to_numpy(float),
                       [HTTP_IN * 1e3, OUT * 1e3, RESIDUAL * 1e3])
    assert split.iloc[0, 1:].tolist() == pytest.approx(split.iloc[1, 1:].tolist())  # the two joins agree
    figures = core.set_index("source")[["ttft_p50", "ttft_p90", "ttft_mean", "tpot_p50", "tpot_p90"]]
    assert figures.iloc[1].tolist() == pytest.approx(figures.iloc[0].tolist(), abs=1e-6)  # its own run again
    assert figures.iloc[3].tolist() == pytest.approx(figures.iloc[2].tolist(), abs=1e-6)
    assert 0 <= core.at[1, "phase_p25"] <= core.at[1, "phase_p75"] < 1
    pct = client[[c for c in client.columns if c.endswith("_pct")]].to_numpy(float)
    assert np.allclose(pct, 0, atol=1e-6)


def test_main_prints_a_case_and_names_an_unknown_one(out, capsys):
    assert ttft_split.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "## mooncake_50" in text and "prediction only" in text and "simulator at sim_server's arrivals" in text
    with pytest.raises(SystemExit):
        ttft_split.main([str(out), "--cases", "azure_80"])
    assert "--cases: ['azure_80'] not among the cases ['mooncake_50']" in capsys.readouterr().err


def test_an_arrivals_phase_is_where_in_the_running_step_it_came():
    steps = pd.DataFrame({"start": [5.0, 0.0, 1.0, 2.0], "duration": [1.0, 1.0, 1.0, 0.5]})
    phases = ttft_split.step_phase(np.array([-1.0, 0.25, 1.5, 2.25, 3.0, 5.75, 6.5]), steps)
    # before any step, in the idle gap after the third and after the last, no step ran
    assert np.allclose(phases, [np.nan, 0.25, 0.5, 0.5, np.nan, 0.75, np.nan], equal_nan=True)


def test_a_simulator_server_cut_short_is_left_out(out, tmp_path, capsys):
    partial = tmp_path / "partial"
    for name in ("harness", "engine_server", "sim_server"):
        shutil.copytree(out / name, partial / name)
    (partial / "sim_server" / "requests.csv").unlink()  # its server never stopped: no tables written
    assert ttft_split.main([str(partial)]) == 0
    text = capsys.readouterr().out
    assert "sim_server: no requests.csv" in text and "prediction only" in text
    assert "sim_server client" not in text and "simulator at sim_server's arrivals" not in text


def test_each_server_is_simulated_at_its_host(out, tmp_path, capsys):
    """The engine server's measured host (its decode graph launches) prices the prediction, the
    profile's beside it; the simulator server's arrivals are simulated at the host it ran at."""
    from experiments.serve import host
    from tests.harness.serve.test_bench_host_merge import SIM, decode_graph_steps

    served = tmp_path / "served"
    for name in ("harness", "engine_server", "sim_server"):
        shutil.copytree(out / name, served / name)
    decode_graph_steps(host.profile_model(SIM), 1.8).to_csv(served / "engine_server" / "steps.csv.gz", index=False)
    (served / "sim_server" / ".hydra").mkdir()
    (served / "sim_server" / ".hydra" / "overrides.yaml").write_text("- backend=sim\n- backend.host_scale=1.8\n")
    folders = ttft_split.unpack(served, tmp_path / "unpacked")
    overrides = ttft_split.case_overrides(folders["harness"], "mooncake_50")
    hosts = ttft_split.server_hosts(folders, overrides)
    assert hosts == pytest.approx({"engine_server": 1.8, "sim_server": 1.8})
    requests = pd.read_csv(folders["engine_server"] / "requests.csv")
    rows = {server: ttft_split.joined(ttft_split.client_records(folders[server], "mooncake_50"), requests)
            for server in ttft_split.SERVERS}
    _, core, client, _ = ttft_split.case_tables(overrides, rows, {"engine_server": 1.8})
    assert list(core["source"]) == ["engine_server own", "simulator at engine_server's arrivals, the profile's host",
                                    "simulator at engine_server's arrivals", "sim_server own",
                                    "simulator at sim_server's arrivals"]
    assert core["host_scale"].tolist() == pytest.approx([1.8, 1.0, 1.8, np.nan, 1.0], nan_ok=True)
    figures = ["ttft_p50", "ttft_mean", "tpot_p50"]
    own, profile, slow = (core.loc[i, figures].to_numpy(float) for i in range(3))
    assert profile == pytest.approx(own, abs=1e-6)  # the simulator's own run, at its own host
    assert slow[1] > profile[1]  # the long prompts' eager prefills launch 1.8x slower
    # the prediction-only figures carry the slower host's core TTFT into the engine server's client's
    assert client.at[1, "ttft_p50"] > client.at[0, "ttft_p50"]
    assert ttft_split.main([str(served)]) == 0
    assert "engine_server 1.800, sim_server 1.800" in capsys.readouterr().out


def test_the_harness_run_is_simulated_at_its_own_arrivals_and_host(out, tmp_path):
    """The harness's run of a case (no server) sits beside the simulator at its arrivals and host:
    here the simulator's own run, so at the profile's host it gives its figures back."""
    from experiments.serve import host
    from tests.harness.serve.test_bench_host_merge import SIM, decode_graph_steps

    served = tmp_path / "served"
    for name in ("harness", "engine_server"):
        shutil.copytree(out / name, served / name)
    (served / "harness" / "mooncake_50").mkdir()
    requests = pd.read_csv(served / "engine_server" / "requests.csv")
    requests.to_csv(served / "harness" / "mooncake_50" / "requests.csv", index=False)
    overrides = ttft_split.case_overrides(served / "harness", "mooncake_50")
    own, speed = ttft_split.harness_run(served / "harness" / "mooncake_50", overrides)
    assert own is not None and len(own) == len(requests) and speed == 1.0  # no step table: the profile's host
    rows = {"engine_server": ttft_split.joined(ttft_split.client_records(served / "engine_server", "mooncake_50"),
                                               requests), "harness": own}
    _, core, _, _ = ttft_split.case_tables(overrides, rows, {"harness": speed})
    figures = core.set_index("source")[["ttft_p50", "ttft_mean", "tpot_p50", "tpot_p90"]]
    assert figures.loc["simulator at harness_run's arrivals"].tolist() == pytest.approx(
        figures.loc["harness_run own"].tolist(), abs=1e-6)
    decode_graph_steps(host.profile_model(SIM), 1.3).to_csv(served / "harness" / "mooncake_50" / "steps.csv.gz",
                                                            index=False)
    assert ttft_split.harness_run(served / "harness" / "mooncake_50", overrides)[1] == pytest.approx(1.3)


def test_the_miss_splits_into_parts_that_add_up_and_a_what_if_is_predicted_again(out, tmp_path, capsys):
    """All three runs are the simulator's own run: the only miss is what the simulator server's
    client adds (outside its core), and --set predicts again beside the served settings."""
    served = tmp_path / "served"
    for name in ("harness", "engine_server", "sim_server"):
        shutil.copytree(out / name, served / name)
    requests = pd.read_csv(served / "engine_server" / "requests.csv")
    (served / "harness" / "mooncake_50").mkdir(exist_ok=True)
    requests.to_csv(served / "harness" / "mooncake_50" / "requests.csv", index=False)
    overrides = ttft_split.case_overrides(served / "harness", "mooncake_50")
    rows = {server: ttft_split.joined(ttft_split.client_records(served / server, "mooncake_50"), requests)
            for server in ttft_split.SERVERS}
    late = 2e-3  # the simulator server's client sees every first token 2 ms later
    rows["sim_server"] = rows["sim_server"].assign(ttft_s=rows["sim_server"]["ttft_s"] + late)
    rows["harness"] = ttft_split.harness_run(served / "harness" / "mooncake_50", overrides)[0]
    _, core, client, parts = ttft_split.case_tables(overrides, rows, {}, ["backend.repeated_reads=overlap"])
    named = [c for c in parts.columns if c.endswith("_pct") and c != "miss_pct"]
    assert parts[named].sum(axis=1).to_numpy() == pytest.approx(parts["miss_pct"].to_numpy(), abs=1e-9)
    by_figure = parts.set_index("figure")
    assert by_figure.loc["ttft_p50", "miss_ms"] == pytest.approx(late * 1e3, abs=1e-6)
    assert by_figure.loc["ttft_p50", "outside_core_pct"] == pytest.approx(by_figure.loc["ttft_p50", "miss_pct"])
    assert np.allclose(by_figure[["sim_off_schedule_pct", "arrivals_pct", "step_model_pct", "server_steps_pct"]],
                       0, atol=1e-6)
    label = " (backend.repeated_reads=overlap)"
    assert "prediction only" + label in set(client["source"])
    assert {"simulator at engine_server's arrivals" + label, "simulator at harness_run's arrivals" + label} \
        <= set(core["source"])
    # every prompt shares its first blocks: overlapped repeats price the decode steps lower
    tpot = core.set_index("source")["tpot_p50"]
    assert tpot["simulator at harness_run's arrivals" + label] < tpot["simulator at harness_run's arrivals"]
    assert ttft_split.main([str(served), "--set", "backend.repeated_reads=overlap"]) == 0
    assert "server_steps_pct" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ttft_split.main([str(served), "--set", "workload.seed=3"])
    assert "--set: ['workload.seed=3']" in capsys.readouterr().err


def test_the_simulations_take_the_settings_the_simulator_server_ran_with(out, tmp_path):
    from experiments.serve.split_inputs import SIM_SERVER_DEFAULTS, served_overrides

    served = tmp_path / "served"
    shutil.copytree(out / "sim_server", served / "sim_server")
    (served / "sim_server" / ".hydra").mkdir()
    (served / "sim_server" / ".hydra" / "overrides.yaml").write_text(
        "- backend=sim\n- backend.cost_model=profiled\n- backend.host_scale=1.3\n- backend.repeated_reads=overlap\n"
        "- serve.port=0\n- hardware.decode_programs_per_sm=5\n- backend.loop_s=1e-4\n- serve.loop_extra_s=2e-5\n"
        "- serve.loop_extra_per_seq_s=1e-6\n")
    given = ["model=qwen3-0.6b"]
    assert served_overrides({"sim_server": served / "sim_server"}, given) == [
        *given, "backend.repeated_reads=overlap", "hardware.decode_programs_per_sm=5", "backend.loop_s=0.00012",
        "backend.loop_per_seq_s=1e-06"]
    # no simulator server's folder (its stage run elsewhere): bench_serve's defaults
    assert served_overrides({}, given) == [*given, *SIM_SERVER_DEFAULTS]
