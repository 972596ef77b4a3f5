"""Autoscale settings the chosen policy does not read are refused in one line naming the field and
the policy (the workload config's neutral-value check), defaults keep working, and an evaluation
interval that would ask the policy more than MAX_EVALUATIONS times over the arrivals is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.autoscale.config import MAX_EVALUATIONS, AutoscaleConfig, build_autoscale, check_evaluations
from harness.autoscale.policies import AUTOSCALE_POLICIES
from harness.autoscale.study import AutoscaleStudyConfig, check_study_reads
from harness.convert import ConfigError
from harness.study import run_study
from tests.harness.conftest import compose_config

REPO_ROOT = Path(__file__).resolve().parents[2]

SLO_SET = ["slo.ttft_p90_s=2"]
SCHEDULE = ["autoscale.schedule=[[0,1]]"]


def build(*overrides: str) -> AutoscaleConfig:
    return build_autoscale(compose_config(list(overrides)))[0]


@pytest.mark.parametrize("policy, setting, reader", [
    ("utilisation", "autoscale.target=0.5", "autoscale.policy=utilisation and autoscale.metric=kv"),
    ("utilisation", "autoscale.target_waiting=2", "autoscale.policy=queue"),
    ("utilisation", "autoscale.slo_target=0.9", "autoscale.policy=slo"),
    ("queue", "autoscale.metric=kv", "autoscale.policy=utilisation"),
    ("queue", "autoscale.target_running=8", "autoscale.policy=utilisation and autoscale.metric=running"),
    ("slo", "autoscale.target_waiting=2", "autoscale.policy=queue"),
    ("slo", "autoscale.slo_metric=ttft", None),  # the default: nothing set
    ("schedule", "autoscale.settle=false", "autoscale.policy=utilisation, queue or slo"),
    ("schedule", "autoscale.slo_scale_down_below=0.3", "autoscale.policy=slo"),
])
def test_a_setting_the_policy_does_not_read_is_refused_naming_field_and_policy(policy, setting, reader):
    extra = SLO_SET if policy == "slo" else SCHEDULE if policy == "schedule" else []
    overrides = [f"autoscale.policy={policy}", setting, *extra]
    if reader is None:
        build(*overrides)
        return
    field = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{field}=.* is ignored by autoscale.policy={policy}\b.*"
                                          rf"read only with {reader}$"):
        build(*overrides)


@pytest.mark.parametrize("policy, settings", [
    ("utilisation", ["autoscale.metric=kv", "autoscale.target=0.5"]),
    ("utilisation", ["autoscale.target_running=16", "autoscale.settle=false"]),
    ("queue", ["autoscale.target_waiting=2"]),
    ("slo", ["autoscale.slo_target=0.9", "autoscale.slo_scale_down_below=0.2", "autoscale.slo_metric=ttft"]),
    ("schedule", ["autoscale.interval_s=5", "autoscale.scale_up_cooldown_s=0"]),
])
def test_settings_the_policy_reads_and_every_default_are_taken(policy, settings):
    extra = SLO_SET if policy == "slo" else SCHEDULE if policy == "schedule" else []
    assert build(f"autoscale.policy={policy}", *settings, *extra).policy == policy
    assert build(f"autoscale.policy={policy}", *extra).policy == policy


def test_every_policy_setting_has_a_reader_and_every_registered_policy_names_real_fields():
    from dataclasses import fields

    names = {f.name for f in fields(AutoscaleConfig)}
    for _, policy in AUTOSCALE_POLICIES.items():
        assert set(policy.READS) <= names and set(policy.READ_WHEN) <= set(policy.READS)


def test_the_harness_refuses_it_in_one_line_with_exit_2(tmp_path):
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "harness", "workload=poisson", "workload.rate=5",
                             "autoscale.policy=queue", "autoscale.target=0.5"], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: autoscale.target=0.5 is ignored by autoscale.policy=queue")


def test_the_study_takes_settings_any_of_its_policies_reads_and_refuses_grid_keys_its_policy_does_not():
    config = AutoscaleConfig(target_waiting=2.0)
    assert check_study_reads(config, AutoscaleStudyConfig(grids={"queue": {}, "slo": {"slo_target": (0.9,)}})) == \
        ["queue", "slo"]
    for grids in ({"utilisation": {"target_running": (8,)}}, {"queue": {"target_waiting": (1.0, 4.0)}}):
        # no policy that reads it runs, or the one that does takes its grid's values instead
        with pytest.raises(ConfigError, match=r"autoscale.target_waiting=2.0 is ignored by experiment=autoscale"):
            check_study_reads(config, AutoscaleStudyConfig(grids=grids))
    # the default experiment's grids, as conf/experiment/autoscale.yaml sets them
    default = AutoscaleStudyConfig(grids={"utilisation": {"target_running": (8, 16)},
                                          "queue": {"target_waiting": (1.0,)},
                                          "slo": {"slo_target": (0.5, 0.8), "slo_scale_down_below": (0.2, 0.4)}})
    assert check_study_reads(AutoscaleConfig(max_replicas=16), default) == ["utilisation", "queue", "slo"]
    with pytest.raises(ConfigError, match=r"autoscale_study.grids.queue.target_running is ignored by "
                                          r"autoscale.policy=queue"):
        check_study_reads(AutoscaleConfig(), AutoscaleStudyConfig(grids={"queue": {"target_running": (8, 16)}}))


@pytest.mark.parametrize("interval, ok", [(15.0, True), (1e-6, False)])
def test_an_interval_asking_the_policy_too_often_is_refused(interval, ok):
    span = 3600.0
    if ok:
        check_evaluations(interval, span, "autoscale")
        return
    with pytest.raises(ConfigError, match=rf"autoscale.interval_s=1e-06 would ask the policy .* more than "
                                          rf"{MAX_EVALUATIONS}"):
        check_evaluations(interval, span, "autoscale")


def test_a_tiny_interval_is_refused_before_the_run(tmp_path):
    cfg = compose_config(["workload=poisson", "workload.num_requests=50", "workload.rate=5", "autoscale.policy=queue",
                          "autoscale.interval_s=1e-6"])
    with pytest.raises(ConfigError, match=r"^autoscale.interval_s=1e-06 would ask the policy"):
        run_study(cfg, tmp_path / "run")


def test_an_autoscale_setting_without_a_policy_is_refused(tmp_path):
    cfg = compose_config(["workload=poisson", "workload.num_requests=5", "workload.rate=5", "autoscale.target=0.5"])
    with pytest.raises(ConfigError, match=r"^autoscale.target=0.5 is ignored by autoscale.policy=null \(a static "
                                          r"fleet of fleet.replicas\); it is read only with a policy"):
        run_study(cfg, tmp_path / "run")


def test_a_tiny_pool_interval_is_refused_naming_the_pool(tmp_path):
    cfg = compose_config(["fleet=disaggregated", "workload=poisson", "workload.num_requests=20", "workload.rate=5",
                          "fleet.prefill.autoscale={policy: queue, interval_s: 1e-6, max_replicas: 2}"])
    with pytest.raises(ConfigError, match=r"^fleet.prefill.autoscale.interval_s=1e-06 would ask the policy"):
        run_study(cfg, tmp_path / "run")
