"""Ctrl-C and SIGTERM for `python -m harness`: the handler that turns either into Interrupted, and
what makes an interrupt end the run as one even where Python or a library did not let it through.

- A signal that was ignored when the process started stays ignored (the classic Unix rule, and
  Python's own for SIGINT): a background job of a shell without job control (`cmd &` in a
  script, or a test runner started so) ignores Ctrl-C, and only SIGTERM stops it.
- An interrupt raised where CPython wraps it (dataclasses' __set_name__ during an import turns it
  into a RuntimeError whose cause it is) is still the interrupt: interrupt_in() finds it.
- An interrupt raised where it is swallowed (a __del__, a weakref callback, library code catching
  BaseException) is remembered by the handler: raise_swallowed() raises it again once the study
  returns, so the exit status still says the run was stopped, and CPython's "Exception ignored"
  report of it is left out (the one line that ends the run says it).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from harness.run_folder import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """The handler of SIGINT and SIGTERM: remembers the first signal and raises Interrupted (again
    at each signal, so a second Ctrl-C stops the cleanup too)."""

    def __init__(self) -> None:
        self.received: Interrupted | None = None
        self._unraisable = sys.unraisablehook

    def install(self) -> None:
        for signum in SIGNALS:
            if signal.getsignal(signum) != signal.SIG_IGN:
                signal.signal(signum, self)
        self._unraisable = sys.unraisablehook
        sys.unraisablehook = self.unraisable

    def unraisable(self, info: Any) -> None:
        """sys.unraisablehook: an interrupt swallowed where CPython ignores exceptions is raised
        again later (raise_swallowed), so it is not reported here; anything else is."""
        if not isinstance(info.exc_value, Interrupted):
            self._unraisable(info)

    def __call__(self, signum: int, frame: object) -> None:
        interrupt = Interrupted(signum, signal.Signals(signum).name)
        if self.received is None:
            self.received = interrupt
        raise interrupt

    def raise_swallowed(self) -> None:
        """Raise the interrupt received so far (the caller got here as if none had come)."""
        if self.received is not None:
            raise self.received


def installed() -> Interrupts | None:
    """The Interrupts handling this process's signals (the harness CLI installs one), if any."""
    for signum in SIGNALS:
        if isinstance(handler := signal.getsignal(signum), Interrupts):
            return handler
    return None


def interrupt_in(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt that error is, or was raised from or while handling, if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def signal_of(interrupt: KeyboardInterrupt) -> tuple[int, str]:
    if isinstance(interrupt, Interrupted):
        return interrupt.signum, interrupt.name
    return int(signal.SIGINT), "SIGINT"


def exit_for(interrupt: KeyboardInterrupt) -> SystemExit:
    """SystemExit(128 + signum). NOTE: a KeyboardInterrupt that left an exec() or eval() of a
    string (dataclasses build their methods so, at import) sets a flag CPython reads at exit under
    `python -m`, and the process would then kill itself with SIGINT instead of exiting with this
    status; evaluating a string that completes clears that flag."""
    eval("None")  # clears CPython's unhandled-KeyboardInterrupt flag (see above)
    return SystemExit(128 + signal_of(interrupt)[0])
