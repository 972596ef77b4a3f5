"""experiments/serve/step_prices.py on a pack the simulator made itself: its reconstructions of
prefill and decode steps from requests.csv must find the prices the simulator charged."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from experiments.serve import step_prices
from harness.run import run_once, write_outcome
from harness.scripting import compose_run_config


def mooncake_trace(path, num=48, seed=0) -> None:
    """Bursts of 12 requests (more than one prefill step) whose prompts share leading 512-token blocks."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as out:
        for i in range(num):
            shared = [0, *range(1000 * (i % 3), 1000 * (i % 3) + int(rng.integers(1, 3)))]  # block 0: everyone's
            length = 512 * len(shared) + int(rng.integers(1000, 2500))
            out.write(json.dumps({"timestamp": 1000 * (i // 12), "input_length": length,
                                  "output_length": int(rng.integers(20, 120)), "hash_ids": shared}) + "\n")


def mooncake_bench_folder(folder, engine_extra: tuple[str, ...] = ()) -> list[str]:
    """folder laid out as a bench's results (a trace and harness/plan.json naming one engine case,
    mooncake_50); returns the case's workload overrides."""
    mooncake_trace(folder / "trace.jsonl")
    overrides = ["model=qwen3-0.6b", "hardware=h100", "workload=mooncake", "workload.rate_scale=2",
                 f"workload.trace_path={folder / 'trace.jsonl'}"]
    (folder / "harness").mkdir()
    (folder / "harness" / "plan.json").write_text(json.dumps(
        [{"overrides": ["backend=engine", *overrides, *engine_extra], "out": "/device/harness/mooncake_50"}]))
    return overrides


def simulated_mooncake_pack(folder):
    """A harness pack (folder/harness) whose case mooncake_50 the simulator ran at step_prices' pricing."""
    overrides = mooncake_bench_folder(folder, ("output.plots=false",))
    outcome = run_once(compose_run_config([*step_prices.SIM, *overrides]), progress=False, record=True)
    write_outcome(outcome, folder / "harness" / "mooncake_50", plots=False)
    return folder / "harness"


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return simulated_mooncake_pack(tmp_path_factory.mktemp("pack"))


def test_the_reconstructions_find_no_error_on_the_simulators_own_run(pack, capsys):
    assert step_prices.main([str(pack), "--case", "mooncake_50"]) == 0
    out = capsys.readouterr().out
    assert "cached tokens equal for 48 of 48 requests" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("engine", "simulator"))}
    prefill_steps, prefill_err, lives, decode_err = (float(x) for x in lines["engine"][1:5])
    assert prefill_steps >= 1 and lives >= 1  # the "engine" here is the simulator: nothing to find
    assert abs(prefill_err) < 0.03 and abs(decode_err) < 0.03
    assert lines["simulator"][2:6] == lines["engine"][1:5]  # its row is "simulator (check)"


def test_recorded_steps_are_priced_by_regime(pack, tmp_path):
    model = step_prices.simulate(step_prices.case_overrides(pack, "mooncake_50"), tmp_path)[1]
    table = step_prices.by_regime(model, pd.read_csv(pack / "mooncake_50" / "steps.csv.gz"))
    assert {"decode_graph"} <= set(table.index) and table["steps"].sum() > 0
    assert abs(table.loc["decode_graph", "sum_err"]) < 0.01  # the prices the simulator charged, recomputed


def test_an_unknown_case_is_one_line(pack):
    with pytest.raises(SystemExit, match="no case 'azure_80'"):
        step_prices.main([str(pack), "--case", "azure_80"])


def test_a_setting_prices_the_steps_again_and_a_bad_one_is_one_line(pack, capsys):
    assert step_prices.main([str(pack), "--case", "mooncake_50", "--set", "backend.repeated_reads=overlap"]) == 0
    overlap = capsys.readouterr().out
    assert step_prices.main([str(pack), "--case", "mooncake_50"]) == 0
    additive = capsys.readouterr().out
    decode = {name: float(next(line for line in out.splitlines() if line.startswith("decode_graph")).split()[3])
              for name, out in (("overlap", overlap), ("additive", additive))}
    assert decode["overlap"] < decode["additive"]  # the shared prompts' blocks read again ride free
    # hardware.* settings too (the decode kernel's waves, counted beyond the grid's spread)
    assert step_prices.main([str(pack), "--case", "mooncake_50", "--set", "hardware.decode_programs_per_sm=5",
                             "backend.decode_programs_baseline=grid_spread"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        step_prices.main([str(pack), "--case", "mooncake_50", "--set", "workload.seed=2"])
    assert "--set: ['workload.seed=2']" in capsys.readouterr().err
