"""Run folders: interrupted runs end in one line and leave a complete folder marked INTERRUPTED or
none; runs started together get folders of their own; the report names a study that did not finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import report
from harness.config import REPO_ROOT
from harness.run_folder import (
    INTERRUPTED,
    STAGING_PREFIX,
    UniqueDirs,
    staged,
    write_csv,
)

QUICK = ["output.progress=false", "output.plots=false"]
SWEEP = ["study.name=sw", "study.kind=sweep", "study.param=workload.seed", "study.values=[0,1,2,3,4,5,6,7,8,9]",
         "workload.num_requests=1500", "output.steps=none"]


def _as_from_a_terminal() -> None:
    """Ctrl-C reaches the run as it does one started at a prompt, even when these tests run with SIGINT
    ignored (a background job of a shell without job control), which the run would inherit and keep."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(cwd: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MPLBACKEND": "Agg"}
    return subprocess.Popen([sys.executable, "-m", "harness", *QUICK, *overrides], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_as_from_a_terminal)


def _wait_for(pattern: str, root: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not list(root.glob(pattern)):
        assert time.monotonic() < deadline, f"nothing matched {pattern} in {timeout_s} s"
        time.sleep(0.05)


def _stop(process: subprocess.Popen, signum: int) -> tuple[int, list[str]]:
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    return process.returncode, [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_run_stopped_midway_exits_in_one_line_and_leaves_no_folder(tmp_path, signum):
    process = _start(tmp_path, "workload.num_requests=200000")  # still running a second in, however fast
    _wait_for("outputs/run/*/.hydra/config.yaml", tmp_path)
    time.sleep(1.0)  # inside the run: Hydra wrote its files before calling the harness
    code, lines = _stop(process, signum)
    assert code == 128 + signum
    assert len(lines) == 1 and lines[0].startswith(f"interrupted ({signal.Signals(signum).name})"), lines
    assert not list(tmp_path.glob("outputs/run/*")), "a run with nothing complete leaves no folder"


def test_a_sweep_stopped_midway_keeps_its_complete_points_marked_and_the_report_says_so(tmp_path, capsys):
    process = _start(tmp_path, *SWEEP)
    _wait_for("outputs/sw/*/points/*/summary.csv", tmp_path)
    code, lines = _stop(process, signal.SIGINT)
    assert code == 130 and len(lines) == 1 and INTERRUPTED in lines[0], lines
    [folder] = tmp_path.glob("outputs/sw/*")
    points = sorted((folder / "points").iterdir())
    assert 1 <= len(points) < 10 and not (folder / "sweep.csv").exists()
    for point in points:  # every point written is whole: no partial table under a real name
        assert sorted(p.name for p in point.iterdir()) == ["requests.csv", "summary.csv"]
        assert len(pd.read_csv(point / "requests.csv")) == 1500
    assert not list(folder.rglob(f"{STAGING_PREFIX}*")) and not list(folder.rglob("*.partial*"))
    marker = (folder / INTERRUPTED).read_text().splitlines()
    assert "planned runs: 10" in marker and f"complete runs: {len(points)}" in marker
    assert marker[-len(points):] == [f"points/{p.name}" for p in points]

    assert report.main([str(tmp_path / "outputs"), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"INCOMPLETE: {folder}")
    assert set(pd.read_csv(tmp_path / "report" / "report.csv")["status"]) == {"interrupted"}


def test_the_report_names_missing_and_interrupted_multirun_jobs(tmp_path, capsys):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MPLBACKEND": "Agg"}
    subprocess.run([sys.executable, "-m", "harness", "-m", *QUICK, "workload.num_requests=4", "workload.seed=0,1,2"],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300)
    [sweep] = tmp_path.glob("multirun/run/*")
    assert report.main([str(sweep), "--out", str(tmp_path / "whole")]) == 0
    assert "INCOMPLETE" not in capsys.readouterr().out
    assert set(pd.read_csv(tmp_path / "whole" / "report.csv")["status"]) == {"complete"}

    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    (jobs[1] / INTERRUPTED).write_text("interrupted by SIGINT\n")
    for path in sorted(jobs[2].rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    jobs[2].rmdir()
    assert report.main([str(sweep), "--out", str(tmp_path / "partial")]) == 0
    out = capsys.readouterr().out
    assert f"INCOMPLETE: {sweep}: Hydra multirun: 1 of 3 jobs complete; 1 interrupted ({jobs[1].name}); " \
           "1 never written (workload.seed=2)" in out
    assert sorted(pd.read_csv(tmp_path / "partial" / "report.csv")["status"]) == ["interrupted", "sweep incomplete"]


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path):
    # the same folder name for both, as two runs of one second get from the default hydra.run.dir
    same = "hydra.run.dir=${unique_dir:'outputs/run/same-second'}"
    processes = [_start(tmp_path, "workload.num_requests=8", same) for _ in range(2)]
    for process in processes:
        assert process.wait(timeout=300) == 0, process.stderr.read()
    folders = sorted(tmp_path.glob("outputs/run/*"))
    assert [f.name for f in folders] == ["same-second", "same-second_1"]
    for folder in folders:  # each holds one whole run, not a mix of two
        assert sorted(p.name for p in folder.iterdir()) == [".hydra", "__main__.log", "requests.csv",
                                                             "steps.csv.gz", "summary.csv"]
        assert len(pd.read_csv(folder / "requests.csv")) == 8


def test_claims_are_unique_across_threads_and_stable_within_a_resolver(tmp_path):
    base = str(tmp_path / "outputs" / "run" / "2030-01-01_00-00-00")
    resolvers = [UniqueDirs() for _ in range(8)]
    claimed: list[str] = []
    threads = [threading.Thread(target=lambda r=r: claimed.append(r(base))) for r in resolvers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(claimed)) == 8 and base in claimed and all(Path(c).is_dir() for c in claimed)
    assert [r(base) for r in resolvers] == [str(c) for r in resolvers for c in r.claimed]


def test_staged_files_appear_whole_or_not_at_all(tmp_path):
    frame = pd.DataFrame({"a": [1, 2]})
    with pytest.raises(KeyboardInterrupt), staged(tmp_path / "run") as staging:
        frame.to_csv(staging / "requests.csv", index=False)
        raise KeyboardInterrupt
    assert list((tmp_path / "run").iterdir()) == []
    with staged(tmp_path / "run") as staging:
        frame.to_csv(staging / "summary.csv", index=False)
        frame.to_csv(staging / "requests.csv", index=False)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["requests.csv", "summary.csv"]
    write_csv(frame, tmp_path / "run" / "sweep.csv", index=False)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "run" / "sweep.csv"), frame)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["requests.csv", "summary.csv", "sweep.csv"]


def _rmtree_interrupted_between_close_and_flag(path, ignore_errors=False):
    """CPython's rmtree when Ctrl-C lands after its os.close and before fd_closed is set: the
    finally closes the descriptor again, and EBADF replaces the interrupt."""
    try:
        raise KeyboardInterrupt
    finally:
        raise OSError(9, "Bad file descriptor")


def test_ctrl_c_inside_the_staging_cleanup_stays_an_interrupt(tmp_path, monkeypatch):
    from harness import run_folder

    with run_folder.staged(tmp_path / "run") as staging:
        (staging / "summary.csv").write_text("x\n")
    monkeypatch.setattr(run_folder.shutil, "rmtree", _rmtree_interrupted_between_close_and_flag)
    with pytest.raises(KeyboardInterrupt):
        run_folder.remove_tree(tmp_path / "run")
    monkeypatch.setattr(run_folder.shutil, "rmtree", lambda path, ignore_errors=False: (_ for _ in ()).throw(
        OSError(13, "Permission denied")))
    with pytest.raises(OSError, match="Permission denied"):
        run_folder.remove_tree(tmp_path / "run")
