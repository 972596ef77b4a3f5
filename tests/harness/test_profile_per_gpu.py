"""A profiled simulator follows the GPU it runs on: a planner's candidate or a disaggregated pool on
another GPU is priced with that GPU's shipped profile where it has one and the run used the
shipped profile of its own, and otherwise with the run's profile carried by sim.transfer; the
same carrying is what backend.profile_hardware asks for on a single run."""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.routers import RouterConfig
from harness.config import build_run_config, load_hardware, on_hardware
from harness.convert import ConfigError
from harness.plan.config import load_catalogue
from harness.plan.evaluate import PlanBase, evaluate
from harness.plan.row import Deployment
from harness.profiles import PROFILES_DIR
from harness.run import run_once
from sim.profiled import ProfiledCostModel
from sim.transfer import transfer
from tests.harness.conftest import compose_config

pytestmark = pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")
PROFILED = ["backend.cost_model=profiled", "model=qwen3-0.6b"]


def _rc(*overrides: str):
    return build_run_config(compose_config([*PROFILED, *overrides]))


def test_a_gpu_with_its_own_shipped_profile_is_priced_by_it():
    moved = on_hardware(_rc("hardware=h100"), load_hardware("h200", "test"))
    assert moved.hardware.name == "H200-SXM-141GB"
    assert moved.sim.profile_path == str(PROFILES_DIR / "h200" / "qwen3-0.6b.csv")
    assert moved.sim.profile_hardware is None


def test_a_gpu_without_one_carries_the_runs_profile():
    rc = _rc("hardware=h100")
    moved = on_hardware(rc, load_hardware("a100", "test"))
    assert moved.sim.profile_path == rc.sim.profile_path
    assert moved.sim.profile_hardware == rc.hardware


def test_an_explicit_profile_is_carried_rather_than_swapped(tmp_path):
    own = tmp_path / "mine.csv"
    own.write_text((PROFILES_DIR / "h100" / "qwen3-0.6b.csv").read_text())
    moved = on_hardware(_rc("hardware=h100", f"backend.profile_path={own}"), load_hardware("h200", "test"))
    assert moved.sim.profile_path == str(own) and moved.sim.profile_hardware.name == "H100-SXM5-80GB"


def test_back_on_the_profiles_own_gpu_nothing_is_carried():
    rc = _rc("hardware=h200", "backend.profile_hardware=h100")
    back = on_hardware(rc, load_hardware("h100", "test"))
    assert back.sim.profile_hardware is None and back.sim.profile_path == rc.sim.profile_path


def test_profile_hardware_prices_the_carried_fit(tmp_path):
    small = ["hardware=h200", "workload.num_requests=40"]
    rc = _rc(*small, "backend.profile_hardware=h100")
    assert rc.sim.profile_path == str(PROFILES_DIR / "h100" / "qwen3-0.6b.csv")  # the h100's shipped fit
    carried_csv = tmp_path / "carried.csv"
    transfer(ProfiledCostModel.load(rc.sim.profile_path), load_hardware("h100", "test"), rc.hardware,
             rc.model).to_csv(carried_csv)
    summary = _metrics(rc)
    assert summary == _metrics(_rc(*small, f"backend.profile_path={carried_csv}"))
    assert summary != _metrics(_rc(*small))  # the h200's own fit


def _metrics(rc) -> dict:
    """A run's summary without its labels (which hold the wall time)."""
    summary = run_once(rc, progress=False, keep_steps=False).summary
    return {f.name: getattr(summary, f.name) for f in dataclasses.fields(summary) if f.name != "labels"}


def test_an_unknown_profile_hardware_is_one_line():
    with pytest.raises(ConfigError, match=r"^backend.profile_hardware: no entry conf/hardware/b300.yaml"):
        _rc("hardware=h200", "backend.profile_hardware=b300")


def test_the_planner_prices_each_gpu_with_its_own_fit(tmp_path):
    own = tmp_path / "mine.csv"
    own.write_text((PROFILES_DIR / "h100" / "qwen3-0.6b.csv").read_text())
    rc = _rc("hardware=h100", "workload.num_requests=40")
    base = PlanBase(rc, load_catalogue(("h100", "h200")), _slo(), RouterConfig())
    on_h200 = evaluate(Deployment("h200", 1, 256, 8192, "nano", "round_robin", 1), base)
    direct = evaluate(Deployment("h200", 1, 256, 8192, "nano", "round_robin", 1),
                      dataclasses.replace(base, rc=_rc("hardware=h200", "workload.num_requests=40")))
    carried = evaluate(Deployment("h200", 1, 256, 8192, "nano", "round_robin", 1),
                       dataclasses.replace(base, rc=_rc("hardware=h100", "workload.num_requests=40",
                                                        f"backend.profile_path={own}")))
    assert on_h200.measures == direct.measures  # the h200's own fit, as a run on the h200 uses
    assert carried.measures != direct.measures  # a profile of the user's own (measured on the h100) is carried


def _slo():
    from harness.plan.config import SLOConfig

    return SLOConfig()
