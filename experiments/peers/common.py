"""What experiments/peers/compare_peers.py and its peer adapters share: the scenarios (committed
engine measurements and their workloads), one tool's prediction, and running a peer's command."""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN6 = HERE.parent / "calibration" / "h100_run6" / "qwen3_8b"
METRICS = ("output_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
COMMON = ["model=qwen3-8b", "hardware=h100", "cache.num_blocks=1450", "output.progress=false"]
ENGINE_TOOL = "engine (measured)"


@dataclass(frozen=True)
class Scenario:
    """One committed engine measurement (calibration run 6, Qwen3-8B, one H100) and its workload."""
    name: str
    overrides: tuple[str, ...]
    engine_summary: Path
    rate: float | None  # requests per second; None: every request at t=0


SCENARIOS = {
    "bench": Scenario("bench", ("workload=bench", "workload.num_requests=256"),
                      RUN6 / "compare_bench" / "engine" / "summary.csv", None),
    "poisson": Scenario("poisson", ("workload=poisson", "workload.num_requests=200", "workload.rate=9.8792"),
                        RUN6 / "compare_poisson" / "engine" / "summary.csv", 9.8792),
}


@dataclass
class Prediction:
    """One tool's figures for one scenario; a metric it does not predict is absent (NaN in the table)."""
    tool: str
    scenario: str
    values: dict[str, float] = field(default_factory=dict)
    runtime_s: float = math.nan
    note: str = ""


def run_tool(cmd: list[str], cwd: str | None = None) -> str:
    """A peer's command's output (stdout, else stderr); RuntimeError with its last error line."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=cwd)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise RuntimeError(f"exit {done.returncode}: {last[0]}")
    return done.stdout if done.stdout.strip() else done.stderr
