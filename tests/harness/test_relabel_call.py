"""experiments/fidelity/relabel_call.py: a call's tables with the GPU it really ran on."""

from __future__ import annotations

import pandas as pd

from experiments.fidelity.relabel_call import main


def _call(tmp_path):
    call = tmp_path / "call"
    call.mkdir()
    heldout = pd.DataFrame({"model": "qwen3-0.6b", "hardware": "H100-SXM5-80GB", "workload": "code_completion",
                            "load": ["0.5", "0.5"], "metric": "ttft_p50_s", "engine": [0.0123456789012] * 2,
                            "sim": [0.011, 0.009], "cost_model": ["profiled", "roofline"], "engine_repeats": 2})
    heldout.to_csv(call / "heldout.csv", index=False)
    return call, heldout


def test_relabel_keeps_the_engine_and_renames_the_gpu_and_cost_models(tmp_path):
    call, heldout = _call(tmp_path)
    out = tmp_path / "out"
    assert main([str(call), "--hardware", "h200", "--rename", "profiled=h100_fit_uncarried", "--out", str(out)]) == 0
    got = pd.read_csv(out / "heldout.csv")
    assert set(got["hardware"]) == {"H200-SXM-141GB"}
    assert list(got["cost_model"]) == ["h100_fit_uncarried", "roofline"]
    assert got["engine"].equals(heldout["engine"]) and got["sim"].equals(heldout["sim"])
    assert set(got["engine_calls"]) == {1}
    assert not (out / "schedules.csv").exists()


def test_relabel_refuses_a_rename_without_a_new_name_in_one_line(tmp_path, capsys):
    call, _ = _call(tmp_path)
    assert main([str(call), "--hardware", "h200", "--rename", "profiled", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
