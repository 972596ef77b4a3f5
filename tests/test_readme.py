"""The README's snippets run as written, in order, in a fresh copy of the repository.

Every ```bash line (continuations joined) and every ```python block of README.md is one snippet.
They run in README order in a copy of the tree (no outputs/, checkpoints/ or report/ from earlier
runs), each from the copy's root, as a newcomer would type them. Snippets matching SKIP never run
here, with the reason given (a GPU-only command carries the comment `# on a GPU`); those matching
SLOW run only in the slow suite (`-m slow`), and the default test checks that no fast snippet needs
a slow one's output. Snippets matching TRACES read the traces in ../shared/traces beside the
checkout: the copy gets the same folder beside it, and where the checkout has none (a fresh
clone) they are left out, which the test says. Keys are substrings of the snippet; a key that
matches nothing is an error, so the lists follow the README.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

SKIP = {
    "pip install": "installs packages (CI has done it before the tests run)",
    "python -m pytest": "the test suite itself",
    "# on a GPU": "needs CUDA",
}
SLOW = {
    "experiment=preemption": "a sweep of whole bench runs",
    "experiment=prefix_cache": "a sweep of whole runs",
    "experiment=chunked_prefill": "a sweep of whole runs",
    "experiment=capacity": "a rate search of many runs",
    "experiment=compare": "engine then simulator runs",
    "backend=engine": "the engine on CPU",
    "workload.num_requests=2000": "a deployment search over 2,000 trace requests",
}
TRACES = {"workload=trace_azure_conv": "reads the Azure conversation trace"}
SHARED = REPO.parent / "shared"  # ../shared/traces: where a trace workload's file is looked up
# What a snippet writes that a later one reads: (writer key, reader key).
DEPENDS = [("hydra/launcher=joblib", "harness.report"), ("engine.checkpoint", "LLM("),
           ("hydra.run.dir=outputs/first", "outputs/first/summary.csv")]
COPY_IGNORE = shutil.ignore_patterns(".git", "outputs", "multirun", "checkpoints", "report", "__pycache__",
                                     ".pytest_cache", ".hypothesis", "*.egg-info", ".benchmarks", "build")
TIMEOUT_S = 1800  # per snippet; the capacity search takes minutes on a loaded 2-core machine


def snippets(text: str) -> list[tuple[str, str]]:
    """(language, code) for each bash line and each python block, in README order."""
    out = []
    for lang, body in re.findall(r"```(bash|python)\n(.*?)```", text, flags=re.S):
        if lang == "python":
            out.append(("python", body))
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(("bash", line.strip()))
    return out


def _matching(code: str, keys: dict[str, str]) -> str | None:
    return next((key for key in keys if key in code), None)


def _run_in_order(tmp_path: Path, include_slow: bool) -> list[str]:
    root = tmp_path / "repo"
    shutil.copytree(REPO, root, ignore=COPY_IGNORE)
    has_traces = (SHARED / "traces").is_dir()
    if has_traces:
        (tmp_path / "shared").symlink_to(SHARED, target_is_directory=True)
    # `python` in a snippet is the interpreter running the tests (CI's environment)
    env = {**os.environ, "MPLBACKEND": "Agg", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = []
    for lang, code in snippets(README.read_text()):
        if _matching(code, SKIP) or (not include_slow and _matching(code, SLOW)):
            continue
        if not has_traces and _matching(code, TRACES):
            warnings.warn(f"not run: {SHARED / 'traces'} is missing, and this snippet reads it: {code}", stacklevel=2)
            continue
        argv = [sys.executable, "-c", code] if lang == "python" else ["bash", "-c", code]
        result = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        assert result.returncode == 0, f"README snippet failed:\n{code}\n--- stderr ---\n{result.stderr[-3000:]}"
        ran.append(code)
    return ran


def test_every_skip_and_slow_key_names_a_readme_snippet():
    codes = [code for _, code in snippets(README.read_text())]
    for key in {**SKIP, **SLOW, **TRACES}:
        assert any(key in code for code in codes), f"{key!r} matches no README snippet: update tests/test_readme.py"
    assert any(lang == "python" for lang, _ in snippets(README.read_text()))


def test_no_fast_snippet_needs_a_slow_or_skipped_one():
    codes = [code for _, code in snippets(README.read_text())]
    for writer, reader in DEPENDS:
        writers = [i for i, c in enumerate(codes) if writer in c]
        readers = [i for i, c in enumerate(codes) if reader in c]
        assert writers and readers and min(writers) < min(readers), (writer, reader)
        assert not any(_matching(codes[i], SKIP) or _matching(codes[i], SLOW) for i in writers), writer


def test_readme_snippets_run_in_order(tmp_path):
    ran = _run_in_order(tmp_path, include_slow=False)
    assert any("LLM(" in code for code in ran) and any(code.startswith("python -m harness") for code in ran)
    root = tmp_path / "repo"
    # what the snippets promise to write
    assert list((root / "outputs").rglob("steps.csv.gz")) and (root / "report" / "report.csv").is_file()
    assert (root / "outputs" / "first" / "summary.csv").is_file()
    if (SHARED / "traces").is_dir():
        assert any(_matching(code, TRACES) for code in ran)


@pytest.mark.slow
def test_readme_snippets_run_in_order_with_the_slow_ones(tmp_path):
    ran = _run_in_order(tmp_path, include_slow=True)
    assert any(_matching(code, SLOW) for code in ran)
