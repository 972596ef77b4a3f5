"""The message loop of a spawned worker process: a tensor-parallel rank (engine.tp.worker_main)
or a data-parallel replica (engine.replica_main). Imports nothing heavy: a replica pins its GPUs
before the CUDA stack loads."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

Handler = Callable[[str, Any], None]


def serve(conn, start: Callable[[], Handler], stop: Callable[[], None]) -> None:
    """start() builds the worker's state and returns its handler of (kind, payload) messages,
    which are answered until "shutdown". A failure, in start() too, goes back to the parent as
    ("error", traceback); EOF means the parent went away. stop() runs last, whatever happened."""
    try:
        handle = start()
        while True:
            kind, payload = conn.recv()
            if kind == "shutdown":
                break
            handle(kind, payload)
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
