"""How far the GPU's event timer and the host's perf_counter drift apart: one anchor event, then
every few seconds an event mapped to the host clock through it (as engine.overlap maps a step's
end) against perf_counter() taken right after the event completed.

    PYTHONPATH=. python experiments/prefill_graphs/clock_drift.py --seconds 240 --out $OUT

Writes clock_drift.csv (elapsed s, mapped - host in ms) and prints it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--every", type=float, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    anchor = torch.cuda.Event(enable_timing=True)
    anchor.record()
    anchor.synchronize()
    anchor_wall = time.perf_counter()
    lines = ["elapsed_s,mapped_minus_host_ms"]
    while time.perf_counter() - anchor_wall < args.seconds:
        time.sleep(args.every)
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        event.synchronize()
        host = time.perf_counter()
        mapped = anchor_wall + anchor.elapsed_time(event) / 1e3
        lines.append(f"{host - anchor_wall:.1f},{(mapped - host) * 1e3:.3f}")
        print(lines[-1], flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "clock_drift.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
