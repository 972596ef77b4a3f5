"""The engine fleet's request intake, measured: from a request's arrival until its replica's loop
can see it (engine.core.intake), the figure a simulated fleet prices with backend.fleet_intake=true.

    python -m experiments.disagg.fleet_intake --midrun MIDRUN --probe PROBE_STEPS --out JSON [--polls-out CSV]
    python -m experiments.disagg.fleet_intake --polls POLLS_CSV --probe PROBE_STEPS --out JSON

--midrun: a served data-parallel engine fleet and its simulation of the same requests
(experiments.autoscale.midrun_dp's output: engine/ and sim/ with requests.csv.gz and steps.csv.gz).
A busy replica's loop reads its pipe once between two steps, just after a step ends: for each
request whose replica was stepping when it arrived, the first such read after the arrival comes
`offset` seconds after it (the step's end plus the loop's median lag from a step's end to its next
iteration, poll_lag_s, measured on the requests seen there: their first scheduling after that step
end), and the request was seen there or not (it was first scheduled before the next step ended).
Requests the simulation did not schedule at that read (a full batch, a budget) are left out, so
the engine misses only by the intake. The intake is a
normal distribution fitted to the seen / missed outcomes by maximum likelihood (mean and sd), the
seen share scaled by its level at offsets over 1.5 ms (below 1 by the engine's own misses).
--polls-out keeps that table (small), and --polls computes the figure from it again.

--probe: experiments.disagg.prefill_probe's probe_steps.csv: its handover rows time a prompt-sized
message from another process to the probe's loop (hop_s), at several prompt lengths; the slope of
their medians over the prompt tokens is per_token_s (the pickled prompt's bytes).

base_s = the fitted mean less per_token_s x the polls' median prompt tokens; poll_lag_s as above.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

PLATEAU_S = 1.5e-3  # past this offset every request's intake is over (the seen share levels off)
IDLE_S = 0.05  # a replica whose last step ended longer ago than this before the arrival was not stepping


def first_reads(run: Path) -> pd.DataFrame:
    """Per request of a replica that was stepping at its arrival: the first step end after it (g_s)
    and whether it was first scheduled before the next step ended (seen), with the lag of its
    first scheduling after that step end (lag_s, where seen)."""
    requests = pd.read_csv(run / "requests.csv.gz")
    steps = pd.read_csv(run / "steps.csv.gz")
    rows = []
    for replica, own in steps.groupby("replica"):
        ends = np.sort((own["start"] + own["duration"]).to_numpy())
        mine = requests[requests["replica"] == replica]
        at = np.searchsorted(ends, mine["arrival"].to_numpy())
        for request, i in zip(mine.itertuples(), at):
            if i == 0 or i + 1 >= len(ends) or ends[i - 1] < request.arrival - IDLE_S:
                continue
            seen = request.first_scheduled < ends[i + 1]
            rows.append((str(request.request_id), request.prompt_tokens, ends[i] - request.arrival, seen,
                         request.first_scheduled - ends[i] if seen else math.nan))
    return pd.DataFrame(rows, columns=["request_id", "prompt_tokens", "g_s", "seen", "lag_s"])


def polls(midrun: Path) -> pd.DataFrame:
    """The engine's first reads of the requests its simulation scheduled at theirs (module doc)."""
    engine, sim = first_reads(midrun / "engine"), first_reads(midrun / "sim")
    both = engine.merge(sim[["request_id", "seen"]], on="request_id", suffixes=("", "_sim"))
    both = both[both["seen_sim"]]
    return pd.DataFrame({"prompt_tokens": both["prompt_tokens"], "g_s": both["g_s"],
                         "seen": both["seen"].astype(int), "lag_s": both["lag_s"]})


def fit_normal(offset: np.ndarray, seen: np.ndarray) -> tuple[float, float, float]:
    """(mean, sd, plateau): plateau is the seen share at offsets over PLATEAU_S; mean and sd maximise
    the likelihood of seen ~ Bernoulli(plateau x Phi((offset - mean) / sd)) on a 10 us grid (mean up
    to 3 ms, sd up to 1 ms), the offsets in 10 us bins."""
    late = offset > PLATEAU_S
    plateau = float(seen[late].mean()) if late.any() else 1.0
    bins = np.round(offset / 1e-5).astype(int)
    frame = pd.DataFrame({"bin": bins, "seen": seen}).groupby("bin")["seen"].agg(["sum", "size"])
    x = frame.index.to_numpy() * 1e-5
    hits, trials = frame["sum"].to_numpy(float), frame["size"].to_numpy(float)
    means, sds = np.arange(0.0, 3e-3, 1e-5), np.arange(1e-5, 1e-3, 1e-5)
    grid_z = np.linspace(-10, 10, 20001)
    grid_phi = 0.5 * (1 + np.array([math.erf(z / math.sqrt(2)) for z in grid_z]))
    best = (-math.inf, 0.0, 0.0)
    for sd in sds:
        p = plateau * np.interp((x[None, :] - means[:, None]) / sd, grid_z, grid_phi)
        p = np.clip(p, 1e-12, 1 - 1e-12)
        ll = (hits * np.log(p) + (trials - hits) * np.log(1 - p)).sum(axis=1)
        k = int(np.argmax(ll))
        if ll[k] > best[0]:
            best = (float(ll[k]), float(means[k]), float(sd))
    return best[1], best[2], plateau


def per_token(probe_steps: Path) -> tuple[float, pd.Series]:
    """The slope (s per token) of the probe's median hand-over hop over the prompt tokens, and the medians."""
    hops = pd.read_csv(probe_steps).dropna(subset=["hop_s"]).groupby("tokens")["hop_s"].median()
    if len(hops) < 2:
        raise ValueError(f"{probe_steps}: handover rows at two prompt lengths at least are needed (hop_s)")
    slope, _ = np.polyfit(hops.index.to_numpy(float), hops.to_numpy(), 1)
    return max(0.0, float(slope)), hops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--midrun", type=Path, help="a midrun_dp output folder (engine/ and sim/ tables)")
    source.add_argument("--polls", type=Path, help="a --polls-out table")
    parser.add_argument("--probe", type=Path, required=True, help="prefill_probe's probe_steps.csv")
    parser.add_argument("--out", type=Path, required=True, help="the calibration JSON to write")
    parser.add_argument("--polls-out", type=Path, default=None, help="keep the polls table (csv.gz)")
    parser.add_argument("--hardware", default="h200", help="the conf/hardware name the figures belong to")
    parser.add_argument("--command", default="", help="the command line, recorded in the JSON")
    args = parser.parse_args(argv)
    table = polls(args.midrun) if args.midrun else pd.read_csv(args.polls)
    if table.empty:
        print("error: no request of a stepping replica to read the intake from", file=sys.stderr)
        return 2
    if args.polls_out is not None:
        table.to_csv(args.polls_out, index=False, float_format="%.7g")
    lag = float(table.loc[table["seen"] == 1, "lag_s"].median())
    mean, sd, plateau = fit_normal((table["g_s"] + lag).to_numpy(), table["seen"].to_numpy())
    slope, hops = per_token(args.probe)
    tokens = float(table["prompt_tokens"].median())
    out = {"hardware": args.hardware, "base_s": round(max(0.0, mean - slope * tokens), 7),
           "per_token_s": float(f"{slope:.4g}"), "poll_lag_s": round(lag, 7), "intake_mean_s": round(mean, 7),
           "intake_sd_s": round(sd, 7),
           "seen_plateau": round(plateau, 3), "at_prompt_tokens": tokens, "requests": len(table),
           "probe_hop_median_s": {str(k): round(float(v), 7) for k, v in hops.items()},
           "command": args.command or " ".join(sys.argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
