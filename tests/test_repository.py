"""Repository hygiene a newcomer meets: generated folders are ignored by git, the README opens with
the two commands (install and run; install and test), and it says which test suites the default
`pytest` leaves out, without counts that would go stale."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
GENERATED = ["outputs/run/x/summary.csv", "multirun/run/x/summary.csv", "report/report.csv",
             "checkpoints/tiny-qwen3/config.json", "experiments/engine/checkpoints/a/config.json",
             "tests/outputs/run/x/steps.csv.gz"]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize("path", GENERATED)
def test_generated_folders_are_ignored(path):
    result = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=REPO)
    assert result.returncode == 0, f"{path} is not git-ignored"


def test_readme_says_how_to_run_the_excluded_suites():
    addopts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    readme = (REPO / "README.md").read_text()
    excluded = addopts.split("-m ")[1].split(" --")[0]  # "'not slow and not gpu'"
    assert excluded.strip("'\"") == "not slow and not gpu"
    for text in (excluded, "python -m pytest -m slow", "python -m pytest -m gpu", 'python -m pytest -m ""'):
        assert text in readme, text


def test_readme_opens_with_the_two_commands():
    """The first two code blocks are what CI runs on a clean machine: install, then the main job;
    install, then the tests, on every core (.ci/run runs the same command)."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    install = 'pip install torch==2.13.0 && pip install -e ".[dev]"'
    assert blocks[0].strip() == f"{install} && python -m harness"
    assert blocks[1].strip() == f"{install} && python -m pytest -n auto"
    assert 'python -m pytest -n auto "$@"' in (REPO / ".ci" / "run").read_text()


def test_readme_states_no_test_counts():
    """Counts of tests change with every commit; the README says how to count them instead."""
    readme = (REPO / "README.md").read_text()
    assert not re.search(r"\d[\d,]* of [\d,]+ tests", readme)
    assert "--collect-only" in readme
