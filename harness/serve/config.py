"""The serve section (conf/serve/default.yaml) as a frozen dataclass."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from typing import Any

MAX_API_SERVERS = 64


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    time_scale: float = 1.0  # simulator: simulated seconds per wall second
    max_queue: int = 1024  # waiting + running requests; one more gets 503 (split over the api_servers)
    api_servers: int = 1  # HTTP processes in front of the one core process (harness.serve.front)
    max_early_ms: float = 2.0  # simulator: a step's writes may start this much before its time
    # engine: a thread of the core process sends each overlapped step's tokens as soon as they
    # exist (harness.serve.handoff); false: the loop sends them after it submits the next step
    early_tokens: bool = True
    # simulator: the server's core loop's own work per step beyond a run's loop (its hand-off and
    # the socket's poll), per step and per running sequence, at the profile's host; added to
    # backend.loop_s / loop_per_seq_s (with_server_loop; docs/loop-cost.md). 0: none
    loop_extra_s: float = 0.0
    loop_extra_per_seq_s: float = 0.0
    served_model_name: str | None = None
    tokenizer: str | None = None
    default_max_tokens: int = 256
    log_level: str = "warning"

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"serve.port must be in [0, 65535], got {self.port}")
        if not self.time_scale > 0:
            raise ValueError(f"serve.time_scale must be > 0 (1: real time), got {self.time_scale}")
        if not 0 <= self.max_early_ms <= 10:
            raise ValueError(f"serve.max_early_ms must be in [0, 10] (0: never before the scheduled time), "
                             f"got {self.max_early_ms}")
        if not isinstance(self.early_tokens, bool):
            raise ValueError(f"serve.early_tokens must be true or false, got {self.early_tokens!r}")
        if isinstance(self.api_servers, bool) or not isinstance(self.api_servers, int) \
                or not 1 <= self.api_servers <= MAX_API_SERVERS:
            raise ValueError(f"serve.api_servers must be a whole number in [1, {MAX_API_SERVERS}] (HTTP processes), "
                             f"got {self.api_servers!r}")
        if self.api_servers > 1 and not (hasattr(os, "memfd_create") and hasattr(socket, "SO_REUSEPORT")):
            raise ValueError("serve.api_servers > 1 needs Linux (SO_REUSEPORT and memfd_create); use 1 here")
        if self.max_queue < 1:
            raise ValueError(f"serve.max_queue must be >= 1, got {self.max_queue}")
        if self.max_queue < self.api_servers:
            raise ValueError(f"serve.max_queue must be >= serve.api_servers ({self.api_servers}: each HTTP process "
                             f"holds its share), got {self.max_queue}")
        if self.default_max_tokens < 1:
            raise ValueError(f"serve.default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if self.tokenizer is not None:
            from engine.preflight import TOKENIZER_FILES, has_tokenizer

            # a folder on this machine: nothing is fetched from a model hub
            if not has_tokenizer(self.tokenizer):
                files = " or ".join(TOKENIZER_FILES)
                raise ValueError(f"serve.tokenizer must be a folder holding a tokenizer ({files}), "
                                 f"got {self.tokenizer!r}")
        for name in ("loop_extra_s", "loop_extra_per_seq_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"serve.{name} must be a number of seconds in [0, 1) (0: none), got {value!r}")
        levels = ("critical", "error", "warning", "info", "debug", "trace")
        if self.log_level not in levels:
            raise ValueError(f"serve.log_level must be one of {levels}, got {self.log_level!r}")


def with_server_loop(rc: Any, config: ServeConfig) -> Any:
    """rc (a harness.config.RunConfig) with the server's extra loop work added to the simulator's
    (SimConfig.loop_s, loop_per_seq_s); rc itself where there is none. ValueError on the engine,
    whose server runs its own loop (the setting prices a simulated one), and for an engine-only
    setting on the simulator."""
    if rc.sim is not None and not config.early_tokens:
        raise ValueError("serve.early_tokens=false is for backend=engine: the simulator's steps hand out their "
                         "tokens when they are due, as the engine's token thread does")
    if not (config.loop_extra_s or config.loop_extra_per_seq_s):
        return rc
    if rc.sim is None:
        raise ValueError(f"serve.loop_extra_s / loop_extra_per_seq_s price the simulator's server loop: they need "
                         f"backend=sim, got backend={rc.backend}")
    sim = replace(rc.sim, loop_s=rc.sim.loop_s + config.loop_extra_s,
                  loop_per_seq_s=rc.sim.loop_per_seq_s + config.loop_extra_per_seq_s)
    return replace(rc, sim=sim)
