"""The held-out protocol's idle start (fidelity.idle_start, backend.idle_start): by default a profiled
cell's step onto an idle device waits the host's measured idle_start_host_s where the GPU host has
one and the profile no lead fits (which price that work already), as experiments/fidelity/
idle_start_h200 chose it for the H200 cells; nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.fidelity import resimulate
from harness.compare.study import sim_run_config
from harness.convert import ConfigError
from harness.fidelity.study import FidelityConfig
from harness.scripting import compose_run_config
from harness.study import run_study
from sim import build_sim_executor
from tests.harness.conftest import compose_config

H200_FIT = "profiles/h200/qwen3-0.6b.csv"  # no lead fits
CARRIED = "experiments/fidelity/h200/qwen3-0.6b_from_h100.csv"  # lead fits
H100_FIT = "experiments/fidelity/h100_leakfree/profile_model.csv"
META = {"num_blocks": 4418, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True}


def idle_s(hardware: str, cost_model: str, profile: str | None, idle_start: bool | None) -> float:
    rc = compose_run_config(["backend=sim", "model=qwen3-0.6b", f"hardware={hardware}"])
    sim_rc = sim_run_config(rc, cost_model, profile, {**META, "idle_start": idle_start})
    return build_sim_executor(sim_rc.model, sim_rc.hardware, sim_rc.sim, sim_rc.cache, sim_rc.scheduler).idle_start_s


def test_the_protocol_prices_it_for_an_h200_profile_without_leads_only() -> None:
    where = FidelityConfig().idle_start
    h200 = compose_run_config(["hardware=h200"]).hardware.idle_start_host_s
    assert idle_s("h200", "profiled", H200_FIT, where) == h200 == pytest.approx(0.96e-3)
    assert idle_s("h200", "profiled", CARRIED, where) == 0.0  # its leads price it
    assert idle_s("h100", "profiled", H100_FIT, where) == 0.0  # no figure
    assert idle_s("h200", "roofline", None, where) == 0.0
    assert idle_s("h200", "roofline", None, True) == 0.0  # the roofline's host costs are not measured
    assert idle_s("h200", "profiled", H200_FIT, False) == 0.0
    with pytest.raises(ValueError, match="lead fits"):
        idle_s("h200", "profiled", CARRIED, True)


def test_resimulate_takes_the_protocols_setting() -> None:
    parse = resimulate._parser().parse_args
    base = ["t.csv", "p.csv", "--label", "x", "--model", "m", "--hardware", "h", "--num-blocks", "1",
            "--num-requests", "1", "--out", "o.csv"]
    settings = [parse([*base, *given]).idle_start for given in ([], ["--idle-start"], ["--idle-start", "auto"])]
    assert [resimulate.IDLE_START[s] for s in settings] == [False, True, None]


def test_bad_values_stop_the_run_in_one_line(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fidelity.idle_start"):
        FidelityConfig(idle_start="yes")
    run = ["experiment=fidelity", f"backend.model={tiny_checkpoint}", "model=tiny-qwen3", "hardware=cpu",
           "backend.device=cpu", "scheduler.max_model_len=512", "cache.block_size=16"]
    for value, says in (("yes", "fidelity.idle_start"), ("true", "has no idle_start_host_s")):
        with pytest.raises(ConfigError) as error:
            run_study(compose_config([*run, f"fidelity.idle_start={value}"]), tmp_path / "run")
        assert "\n" not in str(error.value) and says in str(error.value)
        assert not (tmp_path / "run" / "profile.csv").exists()
