"""A mistyped config group option or key on the command line: one line naming what it may be, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.arguments import check_arguments, config_groups, group_options, run_groups
from harness.config import CONF_DIR, REPO_ROOT


def _options(group: str) -> str:
    return ", ".join(group_options(group))


@pytest.mark.parametrize("argv, group, bad", [
    (["hardware=h300"], "hardware", "h300"),
    (["router=least_token"], "router", "least_token"),
    (["experiment=plann"], "experiment", "plann"),
    (["model=llama-70b"], "model", "llama-70b"),
    (["+experiment=plann"], "experiment", "plann"),
    (["-m", "router=round_robin,least_token"], "router", "least_token"),
    (["--multirun", "workload.num_requests=4", "hardware=h100,h300"], "hardware", "h300"),
])
def test_a_mistyped_option_is_named_with_the_groups_options(argv, group, bad):
    assert check_arguments(argv) == f"{group} must be one of [{_options(group)}], got {bad!r} (conf/{group}/)"


def test_the_options_are_the_groups_files_less_the_refused_spellings():
    assert group_options("hardware") == sorted(p.stem for p in (CONF_DIR / "hardware").glob("*.yaml"))
    assert "qwen3-8b" in group_options("model") and "qwen3_8b" not in group_options("model")
    assert {"model", "hardware", "workload", "scheduler", "backend", "router", "experiment"} <= config_groups()


@pytest.mark.parametrize("argv", [
    [], ["hardware=h200", "router=least_tokens"], ["-m", "scheduler=nano,mixed", "hydra/launcher=joblib"],
    ["model=qwen3_8b"],  # another spelling: refused later, with the name to use
    ["scheduler.max_num_seqs=4", "+scheduler.extra=1"], ["--cfg", "job", "hardware=h300"],  # Hydra's flags: Hydra's
])
def test_lines_hydra_accepts_pass(argv):
    assert check_arguments(argv) is None


@settings(max_examples=40, deadline=None)
@given(group=st.sampled_from(sorted(run_groups())), name=st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,12}", fullmatch=True))
def test_every_group_takes_its_files_and_refuses_the_rest(group, name):
    problem = check_arguments([f"{group}={name}"])
    if (CONF_DIR / group / f"{name}.yaml").is_file():
        assert problem is None
    else:
        assert problem == f"{group} must be one of [{_options(group)}], got {name!r} (conf/{group}/)"


@pytest.mark.parametrize("override, key, parent_key", [
    ("scheduler.max_num_seq=4", "scheduler.max_num_seq", "max_num_seqs"),
    ("cache.bogus.x=1", "cache.bogus", "block_size"),
])
def test_an_unknown_key_is_named_with_its_sections_keys(override, key, parent_key):
    problem = check_arguments([override])
    assert problem.startswith(f"{key} is not a config key") and parent_key in problem
    assert problem.endswith(f"write +{override}")
    assert check_arguments(["-m", override.replace("=", "=1,")]).startswith(f"{key} is not a config key")


@pytest.mark.parametrize("override, option", [
    ("fleet.prefill_replicas=2", "fleet=disaggregated"),  # a key of another fleet shape than the chosen one
    ("plan.hardware=[h100]", "experiment=plan"),  # a section only that experiment adds
    ("-m plan.tp_sizes=[1],[1,2]", "experiment=plan"),
])
def test_a_key_another_option_sets_names_that_option(override, option):
    problem = check_arguments(override.split())
    key = override.split()[-1].split("=")[0]
    assert problem.startswith(f"{key.split('.')[0]}") and f"; {option} has it; " in problem, problem
    *flags, line = override.split()
    assert check_arguments([*flags, option, line]) is None


def test_a_group_of_another_entry_point_is_named_as_such():
    assert run_groups() == config_groups() - {"serve"}
    problem = check_arguments(["serve=default"])
    assert problem is not None and "python -m harness.serve" in problem
    assert check_arguments(["serve.port=8000"]).startswith("serve is not a config key")
    # python -m harness.serve composes the run's groups and its own: each is its to take
    assert run_groups(config_name="serving") == config_groups()
    assert check_arguments(["serve=default", "model=qwen3-8b", "serve.port=0"], config_name="serving") is None
    assert check_arguments(["serve=nope"], config_name="serving").startswith("serve must be one of [default]")
    assert check_arguments(["backend=nope"], config_name="serving").startswith(
        "backend must be one of [engine, sim], got 'nope'")


@pytest.mark.parametrize("argv", [["hardware=h300"], ["scheduler.max_num_seq=4"], ["-m", "router=least_token"],
                                  ["fleet.prefill_replicas=2"], ["serve=default"]])
def test_the_entry_point_prints_one_line_and_exits_2(tmp_path, argv):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-m", "harness", *argv], cwd=tmp_path, capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_help_lists_the_options_the_command_line_takes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-m", "harness", "--help"], cwd=tmp_path, capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    assert result.returncode == 0 and not (tmp_path / "outputs").exists()
    lines = {line.split(":")[0].strip(): line for line in result.stdout.splitlines() if line.startswith("  ")}
    assert lines["model"] == f"  model: {_options('model')}"  # not the refused spellings
    assert set(run_groups()) <= set(lines) and "serve" not in lines  # python -m harness.serve's group
    assert "python -m harness --cfg job" in result.stdout  # where every setting's value is shown
