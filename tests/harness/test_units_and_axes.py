"""The printed summary speaks the CSVs' units (seconds); sweep plots start at zero; GPU studies
refuse a machine without one unless the CPU is asked for."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from harness.compare.study import refuse_engine_without_gpu
from harness.config import build_run_config
from harness.convert import ConfigError
from harness.output.plots import plot_sweep
from harness.report import format_summary
from harness.study import run_study
from tests.harness.conftest import compose_config


def test_the_summary_prints_the_csvs_seconds(tmp_path):
    row = run_study(compose_config(["workload.num_requests=12", "output.plots=false"]), tmp_path).iloc[0].to_dict()
    text = format_summary(row)
    assert not re.search(r"\bms\b", text)
    header, *table = text.splitlines()[3:6]
    assert header.split() == ["mean", "(s)", "p50", "(s)", "p90", "(s)", "p99", "(s)"]
    for line, metric in zip(table, ("ttft", "tpot", "e2e")):
        name, *values = line.split()
        assert name == metric.upper()
        assert [float(v) for v in values] == pytest.approx(
            [row[f"{metric}_{stat}_s"] for stat in ("mean", "p50", "p90", "p99")], abs=1e-5)


@pytest.mark.parametrize("x", [[1, 2, 3], ["nano", "mixed", "fcfs"]])
def test_sweep_panels_start_at_zero(tmp_path, x):
    table = pd.DataFrame({"value": x, "output_tok_s": [1000.0, 1002.0, 1001.0], "ttft_p90_s": [0.5, 0.5001, 0.5002],
                          "err": [-0.2, 0.1, 0.3]})
    fig = plot_sweep(table, "value", ("output_tok_s", "ttft_p90_s", "err"), tmp_path / "sweep.png")
    bottoms = [ax.get_ylim()[0] for ax in fig.axes if ax.get_visible()]
    assert bottoms[:2] == [0.0, 0.0] and bottoms[2] <= -0.2
    assert all(ax.get_ylabel() for ax in fig.axes if ax.get_visible())  # named, with units
    assert np.all(np.isfinite(bottoms))


def _cuda() -> bool:
    torch = pytest.importorskip("torch")
    return torch.cuda.is_available()


def test_gpu_studies_refuse_a_cpu_unless_asked(tmp_path):
    if _cuda():
        pytest.skip("the refusal is for machines without CUDA")
    with pytest.raises(ConfigError, match=r"experiment=fidelity is meant for a GPU .* set backend\.device=cpu, "
                                          r"with a tiny model .*qwen3-0\.6b would take hours"):
        run_study(compose_config(["experiment=fidelity"]), tmp_path)
    assert not list(tmp_path.iterdir())  # refused before a checkpoint or profile was written
    with pytest.raises(ConfigError, match="experiment=compare is meant for a GPU"):
        refuse_engine_without_gpu(build_run_config(compose_config(["experiment=compare", "model=qwen3-8b"])),
                                  "compare", tiny_ok=True)
    # a tiny model compares on a CPU; backend.device=cpu opts in to either study
    refuse_engine_without_gpu(build_run_config(compose_config(["experiment=compare", "model=tiny-qwen3"])),
                              "compare", tiny_ok=True)
    refuse_engine_without_gpu(build_run_config(compose_config(["experiment=fidelity", "backend.device=cpu"])),
                              "fidelity", tiny_ok=False)
