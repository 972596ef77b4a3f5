"""How much a served benchmark's latency percentiles move when the same requests reach the core a few
milliseconds earlier or later: the simulator at the harness run's arrivals, each arrival moved by a
normal draw of --sd-ms, for --seeds draws (its step model and host fixed, so only the arrival times
change).

    python -m experiments.serve.arrival_noise OUT [--trace-dir DIR] [--cases mooncake_50] [--sd-ms 5] [--seeds 10]

OUT: bench_serve's --out folder (its harness stage: the harness's own run of each case and its
host). The engine's and the simulator's servers receive the same requests at their timestamps, yet
their cores record arrivals some milliseconds apart (HTTP, the client's schedule: ttft_split's
`arrivals` part); a percentile that moves by more than a miss under such shifts cannot tell the two
servers apart. A trace's bursts (Mooncake's conversation trace: 200 requests in 25 timestamps)
reach a core in an order the client and the HTTP side decide; any move, however small, reorders
them (--sd-ms 0.001: the order alone). Per case: each figure at the unmoved arrivals (ms) and,
over the draws, the smallest, the largest and the standard deviation in percent of it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments.serve.split_inputs import harness_run, unpack
from experiments.serve.step_prices import case_overrides
from experiments.serve.ttft_split import simulated_at
from harness.compare.tables import markdown

FIGURES = (("ttft_p50", "ttft", 50.0), ("ttft_p90", "ttft", 90.0),
           ("tpot_p50", "tpot", 50.0), ("tpot_p90", "tpot", 90.0))


def figures(frame: pd.DataFrame) -> dict[str, float]:
    return {name: float(np.percentile(frame[column].dropna(), q) * 1e3) for name, column, q in FIGURES}


def moved(own: pd.DataFrame, sd_s: float, seed: int) -> pd.DataFrame:
    """own with each arrival moved by a normal draw of sd_s (seeded), none before the first."""
    shift = np.random.default_rng(seed).normal(0.0, sd_s, len(own))
    return own.assign(arrival=np.maximum(own["arrival"].to_numpy(float) + shift, own["arrival"].min()))


def case_noise(overrides: list[str], own: pd.DataFrame, host_scale: float, sd_s: float, seeds: int) -> pd.DataFrame:
    """One row per figure: at the unmoved arrivals (ms), and the draws' min, max and sd in % of it."""
    base = figures(simulated_at(overrides, own, host_scale))
    draws = pd.DataFrame([figures(simulated_at(overrides, moved(own, sd_s, seed), host_scale))
                          for seed in tqdm(range(seeds), desc="draws", leave=False)])
    pct = (draws / pd.Series(base) - 1) * 100
    return pd.DataFrame({"figure": list(base), "unmoved_ms": list(base.values()), "min_pct": pct.min().to_numpy(),
                         "max_pct": pct.max().to_numpy(), "sd_pct": pct.std(ddof=1).to_numpy()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="bench_serve's --out folder")
    parser.add_argument("--trace-dir", default=None, help="folder of the trace files (default: the cases')")
    parser.add_argument("--cases", type=lambda s: s.split(","), default=None, help="cases (default: every case)")
    parser.add_argument("--sd-ms", type=float, default=5.0, help="standard deviation of an arrival's move (ms)")
    parser.add_argument("--seeds", type=int, default=10, help="draws per case (at least 2)")
    args = parser.parse_args(argv)
    if not args.sd_ms > 0 or args.seeds < 2:
        parser.error(f"--sd-ms must be > 0 and --seeds >= 2, got {args.sd_ms} and {args.seeds}")
    warnings.simplefilter("ignore")  # the cost model's extrapolation warnings
    with tempfile.TemporaryDirectory() as tmp:
        harness = unpack(args.out, Path(tmp), ("harness",))["harness"]
        tags = [Path(entry["out"]).name for entry in json.loads((harness / "plan.json").read_text())]
        unknown = sorted(set(args.cases or []) - set(tags))
        if unknown:
            parser.error(f"--cases: {unknown} not among the cases {tags}")
        for tag in args.cases or tags:
            overrides = case_overrides(harness, tag)
            if args.trace_dir:
                overrides = [o for o in overrides if not o.startswith("workload.trace_dir=")]
                overrides.append(f"workload.trace_dir={Path(args.trace_dir).resolve()}")
            own, host_scale = harness_run(harness / tag, overrides)
            if own is None:
                print(f"## {tag}: the harness pack has no requests.csv, left out")
                continue
            print(f"\n## {tag} (host {host_scale:.3f}, arrivals moved by sd {args.sd_ms:g} ms, {args.seeds} draws)\n")
            print(markdown(case_noise(overrides, own, host_scale, args.sd_ms * 1e-3, args.seeds).round(2)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
