"""The message loop of a spawned worker process: a tensor-parallel rank (engine.tp.worker_main)
or a data-parallel replica (engine.replica_main), and how its failures read in the parent.
Imports nothing heavy: a replica pins its GPUs before the CUDA stack loads, and the harness
catches WorkerError without loading torch."""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from typing import Any

# Returns True when it consumed "shutdown" itself (a replica's run reads its own messages).
Handler = Callable[[str, Any], bool | None]

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


class WorkerError(RuntimeError):
    """A worker process failed or exited: a one-line message; details holds its traceback."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


def error_line(details: str) -> str:
    """A traceback's last line (the exception) and the innermost frame's place, on one line."""
    lines = [line.strip() for line in details.strip().splitlines() if line.strip()]
    if not lines:
        return "no traceback"
    frames = _FRAME.findall(details)
    where = f" ({'/'.join(frames[-1][0].split('/')[-2:])}:{frames[-1][1]})" if frames else ""
    return f"{lines[-1]}{where}"


def serve(conn, start: Callable[[], Handler], stop: Callable[[], None]) -> None:
    """start() builds the worker's state and returns its handler of (kind, payload) messages,
    which are answered until "shutdown". A failure, in start() too, goes back to the parent as
    ("error", traceback); EOF means the parent went away. stop() runs last, whatever happened."""
    try:
        handle = start()
        while True:
            kind, payload = conn.recv()
            if kind == "shutdown" or handle(kind, payload):
                break
    except (EOFError, KeyboardInterrupt):
        pass  # the parent went away: nothing left to serve
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, ValueError):
            pass
    finally:
        stop()
        conn.close()
