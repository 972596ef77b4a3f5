"""`python -m harness.serve` as a child process: started, its port read from its first line, stopped.

Timing studies and load generators need the server in a process of its own (a client in the
server's process shares its GIL and its event loop, and its lag becomes the server's). The server
prints `serving <backend> on http://<host>:<port>/v1 ...` once it listens; stop() sends SIGTERM,
which makes it write requests.csv / steps.csv.gz / summary.csv into its run folder and exit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

_READY = re.compile(r"^serving \w+ on (http://\S+/v1) ")
_OUTPUTS = re.compile(r"outputs: (\S+)\s*$")


class ServerProcess:
    """ServerProcess(overrides, run_dir).start() -> base URL; stop() -> the run folder it wrote."""

    def __init__(self, overrides: list[str], run_dir: Path, python: str = sys.executable,
                 env: dict[str, str] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.args = [python, "-m", "harness.serve", "serve.port=0", *overrides, f"hydra.run.dir={self.run_dir}"]
        self.env = env
        self.base_url = ""
        self.lines: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    def start(self, timeout_s: float = 180.0) -> str:
        self._proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, **(self.env or {})})
        threading.Thread(target=self._read, name="serve-stdout", daemon=True).start()
        if not self._ready.wait(timeout_s) or not self.base_url:
            self.stop()
            tail = "".join(self.lines[-20:])
            raise RuntimeError(f"the server did not start ({' '.join(self.args)}):\n{tail}")
        return self.base_url

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line)
            if not self.base_url and (match := _READY.match(line)):
                self.base_url = match.group(1)
                self._ready.set()
        self._ready.set()  # the process ended before it was ready

    def stop(self, timeout_s: float = 120.0) -> Path:
        """SIGTERM, wait for the outcome to be written; the run folder (requests.csv, summary.csv)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for line in reversed(self.lines):
            if match := _OUTPUTS.search(line):
                return Path(match.group(1))
        return self.run_dir

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
