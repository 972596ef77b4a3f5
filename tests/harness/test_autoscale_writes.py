"""An autoscaled run's folder holds summary.csv only once its timeline, lifetimes, scaling and plot
are in place too: a run stopped while they are written leaves none of them under its real name."""

from __future__ import annotations

import pytest

from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.run import run_autoscaled, write_autoscale_outcome
from harness.config import OutputConfig, build_run_config
from harness.fleet.config import FleetConfig, build_fleet
from harness.run_folder import complete_runs
from tests.harness.conftest import compose_config


def test_a_write_stopped_at_the_plot_leaves_no_complete_run(tmp_path, monkeypatch):
    import harness.autoscale.plots as plots

    cfg = compose_config(["workload.num_requests=8", "workload.prompt_len.high=300", "workload.output_len.high=100"])
    outcome = run_autoscaled(build_run_config(cfg), FleetConfig(replicas=2), build_fleet(cfg)[1],
                             AutoscaleConfig(), SLO(), progress=False)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_autoscale", stopped)
    with pytest.raises(KeyboardInterrupt):
        write_autoscale_outcome(outcome, tmp_path / "run", OutputConfig(progress=False), SLO())
    left = sorted(p.name for p in (tmp_path / "run").iterdir()) if (tmp_path / "run").exists() else []
    assert left == [] and complete_runs(tmp_path) == []
    monkeypatch.undo()
    write_autoscale_outcome(outcome, tmp_path / "run", OutputConfig(progress=False, plots=False), SLO())
    names = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"summary.csv", "timeline.csv", "lifetimes.csv", "scaling.csv", "replica_0", "replica_1"} <= names


def test_a_fleet_write_stopped_at_its_plots_leaves_no_complete_run(tmp_path, monkeypatch):
    import harness.fleet.plots as plots
    from harness.fleet.run import run_fleet_once, write_fleet_outcome

    cfg = compose_config(["workload.num_requests=8", "workload.prompt_len.high=300", "workload.output_len.high=100"])
    outcome = run_fleet_once(build_run_config(cfg), FleetConfig(replicas=2), build_fleet(cfg)[1], False)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_fleet_latency", stopped)
    with pytest.raises(KeyboardInterrupt):
        write_fleet_outcome(outcome, tmp_path / "run")
    left = sorted(p.name for p in (tmp_path / "run").iterdir()) if (tmp_path / "run").exists() else []
    assert left == [] and complete_runs(tmp_path) == []
    monkeypatch.undo()
    write_fleet_outcome(outcome, tmp_path / "run")
    names = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"summary.csv", "requests.csv", "replica_0", "replica_1", "load.png", "latency_cdf.png"} <= names
