"""A run folder's life: a name no other run takes, files that appear only when complete, and what
an interrupted run leaves behind.

- Names: UniqueDirs is the `unique_dir` resolver of conf/config.yaml's hydra.run.dir. It claims
  the folder with os.mkdir, which fails for every process but one, so two runs started in the same
  second get `<time>` and `<time>_1` instead of writing into one folder.
- Files: staged(out_dir) hands out a hidden folder to write into and moves its files into out_dir
  once all of them are written (summary.csv last), so a folder holding summary.csv holds a whole
  run, and a killed write leaves no half-written CSV under its real name. write_csv does the same
  for one table.
- Interruption: finish_interrupted() removes a folder holding only Hydra's bookkeeping (.hydra/,
  the job log: nothing to look at, and an empty folder would read as a run), and otherwise writes
  an INTERRUPTED marker naming the complete runs it holds (a sweep's finished points are hours
  of work worth keeping). harness.report reads the marker.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

INTERRUPTED = "INTERRUPTED"  # the marker file of a run folder whose study did not finish
STAGING_PREFIX = ".partial-"  # hidden folders of files being written (harness.report skips them)
RESULT_FILES = ("summary.csv", "sweep.csv")  # a folder holding one of these holds a complete run
LAST = "summary.csv"  # moved last: its presence says the run's other files are in place


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: a KeyboardInterrupt that remembers the signal (exit status 128 + signum)."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(name)
        self.signum = signum
        self.name = name


class UniqueDirs:
    """An OmegaConf resolver: `${unique_dir:'outputs/run/<time>'}` is that folder, created here, or
    `<time>_1`, `<time>_2`, ... when another run holds it. One instance per process remembers its
    answers, so resolving the same path again returns the folder claimed the first time."""

    def __init__(self) -> None:
        self._claimed: dict[str, str] = {}

    @property
    def claimed(self) -> list[Path]:
        return [Path(folder) for folder in self._claimed.values()]

    def __call__(self, base: str) -> str:
        if base not in self._claimed:
            self._claimed[base] = claim(base)
        return self._claimed[base]


def claim(base: str) -> str:
    """The first of base, base_1, base_2, ... that this call created (an atomic mkdir)."""
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    for n in range(10_000):
        candidate = base if n == 0 else f"{base}_{n}"
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"hydra.run.dir: {base} and 9,999 numbered folders beside it exist")


def remove_tree(path: Path) -> None:
    """shutil.rmtree(path, ignore_errors=True), except that a Ctrl-C landing inside it stays a
    KeyboardInterrupt: CPython's rmtree closes its folder's descriptor again in a finally when the
    signal arrives between the close and the flag that records it, and that EBADF would replace
    the interrupt (an exit status of 1 and a traceback instead of a clean stop)."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except OSError as error:
        if isinstance(error.__context__, KeyboardInterrupt):
            raise error.__context__ from None
        raise


@contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """A hidden folder inside out_dir to write a run's files into; when the block ends normally
    they move into out_dir (summary.csv last), and when it raises they are deleted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / f"{STAGING_PREFIX}{os.getpid()}"
    remove_tree(staging)
    staging.mkdir()
    try:
        yield staging
        for path in sorted(staging.iterdir(), key=lambda p: p.name == LAST):
            os.replace(path, out_dir / path.name)
    finally:
        remove_tree(staging)


def write_csv(frame: pd.DataFrame, path: Path, **kwargs) -> None:
    """frame.to_csv(path) through a hidden temporary name, renamed when complete."""
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        frame.to_csv(partial, **kwargs)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def complete_runs(out_dir: Path) -> list[str]:
    """The folders under out_dir (relative; "." for itself) that hold a complete run's table."""
    found = {path.parent for name in RESULT_FILES for path in out_dir.rglob(name)
             if not any(part.startswith(STAGING_PREFIX) for part in path.relative_to(out_dir).parts)}
    return sorted(str(folder.relative_to(out_dir)) for folder in found)


def finish_interrupted(out_dir: Path, signal_name: str, planned: int | None = None) -> str:
    """Leave out_dir complete or gone after an interruption; returns what was done, in words."""
    for staging in out_dir.glob(f"{STAGING_PREFIX}*"):
        remove_tree(staging)
    if remove_if_unused(out_dir):
        return f"nothing complete was written; removed {out_dir}"
    done = complete_runs(out_dir)
    lines = [f"interrupted by {signal_name} at {time.strftime('%Y-%m-%d %H:%M:%S')}: the study did not finish",
             f"planned runs: {planned if planned is not None else 'unknown'}",
             f"complete runs: {len(done)}", *done]
    (out_dir / INTERRUPTED).write_text("\n".join(lines) + "\n")
    of = f" of {planned}" if planned is not None else ""
    return f"kept {len(done)}{of} complete run(s) in {out_dir}, marked {INTERRUPTED}"


def remove_if_unused(out_dir: Path) -> bool:
    """Delete a run folder that holds only what Hydra wrote before the run (.hydra/, the job log),
    and the parents it leaves empty, up to the working directory; True when it was deleted."""
    if not out_dir.is_dir() or any(p.name != ".hydra" and p.suffix != ".log" for p in out_dir.iterdir()):
        return False
    shutil.rmtree(out_dir)
    cwd = Path.cwd().resolve()
    parent = out_dir.resolve().parent
    while parent != cwd and cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
    return True
