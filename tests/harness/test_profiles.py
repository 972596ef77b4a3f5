"""The shipped profiles: backend.cost_model=profiled with no profile_path prices with
profiles/<hardware>/<model>.csv, gives what the same file named explicitly gives, and refuses a
pair without one in one line; the default run stays on the roofline."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.config import build_run_config
from harness.convert import ConfigError
from harness.paths import CONF_DIR
from harness.profiles import PROFILES_DIR, hardware_conf_name, shipped_profile, shipped_profiles
from harness.study import run_study
from sim.profiled import ProfiledCostModel
from tests.harness.conftest import compose_config

SMALL = ["workload.num_requests=24", "output.plots=false", "output.steps=none"]


def test_the_shipped_profiles_are_the_h100_and_h200_fits():
    assert shipped_profiles() == ["h100/qwen3-0.6b", "h100/qwen3-8b", "h200/qwen3-0.6b"]
    assert (PROFILES_DIR / "README.md").is_file()


@pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")
@pytest.mark.parametrize("pair", shipped_profiles())
def test_profiled_with_no_path_picks_the_runs_hardware_and_model(pair):
    hardware, model = pair.split("/")
    rc = build_run_config(compose_config([f"hardware={hardware}", f"model={model}", "backend.cost_model=profiled"]))
    assert rc.sim.profile_path == str(PROFILES_DIR / hardware / f"{model}.csv")
    assert rc.sim.profile_tp_size == 1  # every shipped profile was measured at TP=1
    ProfiledCostModel.load(rc.sim.profile_path)  # the file is a fit the simulator reads


def test_the_default_run_stays_on_the_roofline():
    rc = build_run_config(compose_config([]))
    assert rc.sim.cost_model == "roofline" and rc.sim.profile_path is None and rc.sim.profile_tp_size is None


def test_an_explicit_profile_path_wins_over_the_shipped_one():
    explicit = PROFILES_DIR / "h200" / "qwen3-0.6b.csv"
    rc = build_run_config(compose_config(["hardware=h100", "backend.cost_model=profiled",
                                          f"backend.profile_path={explicit}"]))
    assert rc.sim.profile_path == str(explicit) and rc.sim.profile_tp_size is None


@pytest.mark.parametrize("overrides, where", [
    (["hardware=a100"], "model=qwen3-0.6b on hardware=a100"),
    (["model=qwen3-4b"], "model=qwen3-4b on hardware=h100"),
    (["hardware.name=my-gpu"], "on hardware 'my-gpu'"),
])
def test_a_pair_without_a_profile_is_refused_in_one_line_listing_the_pairs(overrides, where):
    with pytest.raises(ConfigError) as error:
        build_run_config(compose_config(["backend.cost_model=profiled", *overrides]))
    message = str(error.value)
    assert message.startswith("backend.profile_path:") and where in message and "\n" not in message
    assert all(pair in message for pair in shipped_profiles()) and "backend.cost_model=roofline" in message


def test_no_profiles_at_all_is_said(tmp_path):
    with pytest.raises(ConfigError, match="profiles/ has none"):
        shipped_profile("H100-SXM5-80GB", "qwen3-0.6b", root=tmp_path)


def test_every_hardware_entry_maps_back_to_its_conf_name():
    import yaml

    for path in CONF_DIR.joinpath("hardware").glob("*.yaml"):
        assert hardware_conf_name(yaml.safe_load(path.read_text())["name"]) == path.stem
    assert hardware_conf_name("no such GPU") is None


@pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")
@pytest.mark.parametrize("pair", ["h100/qwen3-0.6b", "h200/qwen3-0.6b"])
def test_the_default_pick_gives_the_same_summary_as_the_explicit_path(pair, tmp_path):
    hardware, model = pair.split("/")
    base = [*SMALL, f"hardware={hardware}", f"model={model}", "backend.cost_model=profiled"]
    explicit = f"backend.profile_path=profiles/{pair}.csv"  # relative: found from the repository root
    run_study(compose_config([*base, explicit]), tmp_path / "explicit")
    run_study(compose_config(base), tmp_path / "default")
    for table in ("summary.csv", "requests.csv"):
        before = pd.read_csv(tmp_path / "explicit" / table).drop(columns=["wall_s"], errors="ignore")
        after = pd.read_csv(tmp_path / "default" / table).drop(columns=["wall_s"], errors="ignore")
        assert len(before) == (1 if table == "summary.csv" else 24)
        pd.testing.assert_frame_equal(before, after)  # exact: the same fit read from the same file
