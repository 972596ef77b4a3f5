"""experiments/kernels/prefill_balance.py: the prefill kernel's per-program rate probe. On a CPU its
--dry-run prices every shape with a planted rate (through sim.prefill_programs, the simulator's
rule) and its fit recovers it; on a GPU it times the kernel within its budget."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.kernels import prefill_balance


def test_the_dry_run_recovers_the_planted_rate(tmp_path, capsys):
    assert prefill_balance.main(["--out", str(tmp_path), "--dry-run"]) == 0
    fitted = pd.read_csv(tmp_path / "fit.csv").set_index("launch")
    assert set(fitted.index) == {"graph", "eager"}
    assert fitted["rate_keys_per_s"].to_numpy() == pytest.approx(prefill_balance.PLANTED_RATE, rel=1e-6)
    kernel = pd.read_csv(tmp_path / "kernel.csv")
    assert len(kernel) == 2 * len(prefill_balance.shapes())
    # a small chunk after a long cached context waits on its programs; a fresh one hardly
    one = kernel[(kernel.seqs == 1) & (kernel.chunk == 16) & (kernel.launch == "graph")].set_index("cached")
    assert one.loc[8192, "excess_keys"] > 100 * one.loc[0, "excess_keys"]


def test_bad_settings_are_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="multiple of --kv-heads"):
        prefill_balance.main(["--out", str(tmp_path), "--dry-run", "--heads", "12", "--kv-heads", "8"])
    with pytest.raises(SystemExit, match="budget-s"):
        prefill_balance.main(["--out", str(tmp_path), "--dry-run", "--budget-s", "0"])


@pytest.mark.gpu
def test_the_probe_times_the_kernel_on_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert prefill_balance.main(["--out", str(tmp_path), "--budget-s", "3"]) == 0
    kernel = pd.read_csv(tmp_path / "kernel.csv")
    assert (kernel["us"] > 0).all()


def test_residuals_vanish_at_the_planted_rate_only(tmp_path):
    from experiments.kernels.prefill_balance_residuals import residuals
    prefill_balance.main(["--out", str(tmp_path), "--dry-run"])
    kernel = pd.read_csv(tmp_path / "kernel.csv")
    _, right = residuals(kernel, 1 / prefill_balance.PLANTED_RATE)
    _, wrong = residuals(kernel, 2 / prefill_balance.PLANTED_RATE)
    assert right["max_abs"].max() < 1e-6
    assert wrong.set_index("model").loc["grid", "max_abs"].min() > 0.05


def test_the_kv_floor_recovers_a_planted_bandwidth_and_the_sum_cannot_fit_it(tmp_path):
    from experiments.kernels.prefill_kv_bytes import KV_BYTES, compare, main
    prefill_balance.main(["--out", str(tmp_path), "--dry-run"])
    kernel = pd.read_csv(tmp_path / "kernel.csv")
    gb = kernel["seqs"] * kernel["cached"] * KV_BYTES / 1e9
    kernel["us"] = np.maximum(kernel["us"], 3.0 + gb * 250.0)  # HBM at 4 TB/s under the planted walk
    _, summary = compare(kernel, KV_BYTES)
    floor = summary.set_index(["launch", "model"]).loc[("graph", "floor")]
    assert floor["kv_TB_per_s"] == pytest.approx(4.0, rel=0.01) and floor["max_abs"] < 1e-3
    assert summary.set_index(["launch", "model"]).loc[("graph", "sum"), "max_abs"] > 0.01
    path = tmp_path / "planted.csv"
    kernel.to_csv(path, index=False)
    assert main([str(path)]) == 0
