"""Interrupts that Python or a library does not let through still end the run as Ctrl-C does: exit
130, one line, the run folder complete and marked or gone (harness.interrupts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import REPO_ROOT
from harness.interrupts import Interrupts, interrupt_in
from harness.run_folder import INTERRUPTED, Interrupted

# Runs the harness (as `python -m`, whose exit CPython handles apart) with the core loop wrapped so
# that a SIGINT lands where CPython does not let it through, then the run goes on.
DRIVER = '''
import os, signal, sys
import harness.run
from harness.__main__ import cli

def ctrl_c_here():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10**8):  # the handler runs in here
        pass

class SwallowsIt:  # CPython ignores what __del__ raises
    def __del__(self):
        ctrl_c_here()

class WrapsIt:  # CPython 3.11 raises RuntimeError from what __set_name__ raises
    def __set_name__(self, owner, name):
        ctrl_c_here()

def in_exec():  # a KeyboardInterrupt leaving an exec() marks the process to die by SIGINT at exit
    exec("ctrl_c_here()", {"ctrl_c_here": ctrl_c_here})

WHERE = {"del": lambda: SwallowsIt(), "set_name": lambda: type("C", (), {"x": WrapsIt()}), "exec": in_exec}
loop = harness.run.run

def run(*args, **kwargs):
    WHERE[os.environ["INTERRUPT_IN"]]()
    return loop(*args, **kwargs)

harness.run.run = run
cli(sys.argv[1:])
'''


def _run_interrupted_in(where: str, cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "interrupting.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO_ROOT)]), "MPLBACKEND": "Agg",
           "INTERRUPT_IN": where}
    return subprocess.run([sys.executable, "-m", "interrupting", "output.progress=false", "output.plots=false",
                           "workload.num_requests=20"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_an_interrupt_swallowed_by_a_del_still_stops_the_run_in_one_line(tmp_path):
    result = _run_interrupted_in("del", tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 130 and len(lines) == 1, result.stderr
    assert lines[0].startswith("interrupted (SIGINT): kept 1 complete run(s)") and INTERRUPTED in lines[0]
    [folder] = tmp_path.glob("outputs/run/*")
    assert (folder / "summary.csv").exists() and (folder / INTERRUPTED).exists()


@pytest.mark.parametrize("where", ["set_name", "exec"])
def test_an_interrupt_wrapped_or_left_in_an_exec_still_exits_130_in_one_line(tmp_path, where):
    result = _run_interrupted_in(where, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 130 and len(lines) == 1, result.stderr
    assert lines[0].startswith("interrupted (SIGINT): nothing complete was written")
    assert not list(tmp_path.glob("outputs/run/*"))


@pytest.fixture
def restored_signals():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    sys.unraisablehook = hook


def test_each_signal_raises_and_the_first_is_remembered(restored_signals):
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a prompt, however pytest was started
    interrupts = Interrupts()
    interrupts.install()
    interrupts.raise_swallowed()  # nothing received: nothing raised
    for signum in (signal.SIGTERM, signal.SIGINT):  # a second Ctrl-C stops the cleanup too
        with pytest.raises(Interrupted) as raised:
            signal.raise_signal(signum)
            for _ in range(10**8):
                pass
        assert raised.value.signum == signum
    with pytest.raises(Interrupted) as again:
        interrupts.raise_swallowed()
    assert again.value.name == "SIGTERM"


def test_a_signal_ignored_at_start_stays_ignored(restored_signals):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Interrupts().install()
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    assert isinstance(signal.getsignal(signal.SIGTERM), Interrupts)


def test_an_interrupt_is_found_through_the_errors_it_caused():
    interrupt = Interrupted(2, "SIGINT")
    try:
        try:
            raise interrupt
        except KeyboardInterrupt as error:
            raise RuntimeError("wrapped") from error
    except RuntimeError as wrapped:
        assert interrupt_in(wrapped) is interrupt
    assert interrupt_in(ValueError("no")) is None
