"""The cold start beside a serving replica: what a replica started mid-run pays for sharing its host.

Run 1 (h200_run1/) measured the second replica's start inside the fleet 3 s longer than the same
start probed alone: the new process shares the host's CPU cores, page cache and PCIe with a
replica serving a saturating load (and the process that routes to it). This probe measures that
start on its own, so that the simulated fleet can price it without reading the run it predicts:
a neighbour process (an engine on GPU 0, or the CPU) serves --rate req/s; once it serves, the
cold-start probe (experiments/autoscale/cold_start.py) starts the engine on GPU 1 `cached` times.
Each row records whether the neighbour was still serving when the start ended; the phases
(process, set-up, load, KV cache, capture) show which part the neighbour slows.

merged() files the result under "under_load" in the alone probe's calibration, which
harness.autoscale.calibration then prices a mid-run start with.

  python -m experiments.autoscale.loaded_probe --serve OVERRIDES...   # the neighbour (midrun_dp starts it)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.autoscale import cold_start


def neighbour_overrides(model: str, ckpt: Path, hardware: str, rate: float, duration_s: float, max_num_seqs: int,
                        extra: list[str]) -> list[str]:
    """One engine replica serving `rate` req/s (Poisson) for duration_s after its start."""
    return ["backend=engine", f"model={model}", f"backend.model={ckpt}", f"hardware={hardware}", "workload=poisson",
            f"workload.rate_profile=[[0,{rate:g}]]", f"workload.duration_s={duration_s:g}",
            f"scheduler.max_num_seqs={max_num_seqs}", "output.progress=false", "output.plots=false", *extra]


def probe_under_load(model: str, ckpt: Path, hardware: str, out: Path, cached: int, settings: list[str],
                     neighbour: list[str], serving_after_s: float, cpu: bool) -> dict:
    """Start the neighbour, wait serving_after_s (its own start, measured alone, and a margin), then
    probe; returns the probe's calibration with the neighbour's state at each start's end."""
    env = dict(os.environ)
    if not cpu:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    log_dir = Path(tempfile.mkdtemp(prefix="midrun-neighbour-"))
    with open(log_dir / "neighbour.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "experiments.autoscale.loaded_probe", "--serve",
                                 str(log_dir), *neighbour], env=env, stdout=log, stderr=subprocess.STDOUT)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        print(f"[loaded probe] neighbour serving from about {serving_after_s:.0f} s (log {log_dir}/neighbour.log)",
              flush=True)
        time.sleep(serving_after_s)
        if proc.poll() is not None:
            raise SystemExit(f"error: the neighbour exited (code {proc.returncode}) before the probe; see "
                             f"{log_dir}/neighbour.log")
        if not cpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = "1"  # the probe's spawned process inherits it
        calibration = cold_start.probe(model, ckpt, hardware, out, 0, cached, False, settings,
                                       "experiments.autoscale.loaded_probe (a replica serving beside it)")
        calibration["neighbour_serving_at_end"] = proc.poll() is None
        calibration["neighbour"] = " ".join(neighbour)
        return calibration
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def merged(alone_path: Path, loaded: dict) -> dict:
    """The alone probe's calibration with the loaded one under "under_load" (written back)."""
    calibration = json.loads(alone_path.read_text())
    calibration["under_load"] = loaded
    alone_path.write_text(json.dumps(calibration, indent=2) + "\n")
    return calibration


def serve(out_dir: Path, overrides: list[str]) -> None:
    from harness.scripting import compose_config
    from harness.study import run_study

    run_study(compose_config(overrides), out_dir)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--serve":
        raise SystemExit("usage: python -m experiments.autoscale.loaded_probe --serve OUT_DIR OVERRIDES...")
    serve(Path(sys.argv[2]), sys.argv[3:])
