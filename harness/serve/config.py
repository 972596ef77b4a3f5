"""The serve section (conf/serve/default.yaml) as a frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    time_scale: float = 1.0  # simulator: simulated seconds per wall second
    max_queue: int = 1024  # waiting + running requests; one more gets 503
    max_early_ms: float = 2.0  # simulator: a step's writes may start this much before its time
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
        if self.max_queue < 1:
            raise ValueError(f"serve.max_queue must be >= 1, got {self.max_queue}")
        if self.default_max_tokens < 1:
            raise ValueError(f"serve.default_max_tokens must be >= 1, got {self.default_max_tokens}")
        levels = ("critical", "error", "warning", "info", "debug", "trace")
        if self.log_level not in levels:
            raise ValueError(f"serve.log_level must be one of {levels}, got {self.log_level!r}")
