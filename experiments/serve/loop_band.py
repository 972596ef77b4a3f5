"""The prediction alone over a band of host speeds, with and without settings (the loop's pricing):
the engine server's client figures with its core's TTFT and TPOT replaced by the simulator's at
its arrivals (experiments.serve.ttft_split.simulated_at), % against the engine server's client.

    python -m experiments.serve.loop_band OUT --case azure_50=1.526,1.751 --case mooncake_50=1.516,1.526,1.536 \
        --set backend.loop_s=7.534e-05 backend.loop_per_seq_s=3.566e-06

OUT: a bench_serve output (its harness and engine_server packs; docs/loop-cost.md's tables). A case
whose TTFT P50 moves by many points within a fraction of a percent of host is one whose P50 sits
where a burst's prefills split into steps: read the median over its band.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve.split_inputs import served_overrides, unpack
from experiments.serve.step_prices import case_overrides
from experiments.serve.tables import case_requests
from experiments.serve.ttft_split import client_records, joined, ms, simulated_at

FIGURES = ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90")


def case_hosts(text: str) -> tuple[str, list[float]]:
    tag, _, hosts = text.partition("=")
    try:
        values = [float(h) for h in hosts.split(",")]
    except ValueError:
        values = []
    if not tag or not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"--case wants CASE=HOST[,HOST...] with hosts > 0, got {text!r}")
    return tag, values


def figures(ttft, itl) -> list[float]:
    return [ms(ttft, 50), ms(ttft, 90), ms(itl, 50), ms(itl, 90)]


def band_rows(out: Path, cases: dict[str, list[float]], settings: list[str]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = unpack(out, Path(tmp), optional=("sim_server",))
        tags = [Path(e["out"]).name for e in json.loads((folders["harness"] / "plan.json").read_text())]
        unknown = sorted(set(cases) - set(tags))
        if unknown:
            raise SystemExit(f"loop_band: no case {unknown} in {out}; its cases: {tags}")
        records = [client_records(folders["engine_server"], tag) for tag in tags]
        served = pd.read_csv(folders["engine_server"] / "requests.csv")
        owns = case_requests(served, [len(r) for r in records], records)
        for tag, own, record in zip(tags, owns, records):
            if tag not in cases:
                continue
            given = [o for o in case_overrides(folders["harness"], tag) if not o.startswith("workload.trace_dir=")]
            given.append(f"workload.trace_dir={Path('../shared/traces').resolve()}")
            overrides = served_overrides(folders, given)
            engine = joined(record, own)
            measured = figures(engine.ttft_s, engine.itl_s)
            for host in cases[tag]:
                for name, sets in (("off", []), ("on", settings)):
                    sim = simulated_at([*overrides, *sets], engine, host)
                    ttft = engine.ttft_s - engine.ttft + sim["ttft"].to_numpy()
                    itl = engine.itl_s - engine.tpot + sim["tpot"].to_numpy()
                    pct = [100 * (p / m - 1) for p, m in zip(figures(ttft, itl), measured)]
                    rows.append({"case": tag, "host": host, "settings": name, **dict(zip(FIGURES, pct))})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--case", type=case_hosts, action="append", required=True)
    parser.add_argument("--set", nargs="+", default=[], dest="settings", help="the 'on' variant's overrides")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = band_rows(args.out, dict(args.case), args.settings)
    print("| case | host | settings | " + " | ".join(f"{f} %" for f in FIGURES) + " |")
    print("|---|---|---|" + "---|" * len(FIGURES))
    for row in rows:
        print(f"| {row['case']} | {row['host']:.3f} | {row['settings']} | "
              + " | ".join(f"{row[f]:+.1f}" for f in FIGURES) + " |")
    for tag in dict(args.case):
        for name in ("off", "on"):
            values = np.array([[r[f] for f in FIGURES] for r in rows if r["case"] == tag and r["settings"] == name])
            print(f"{tag} {name}, median over the band: " + ", ".join(
                f"{f} {v:+.1f}%" for f, v in zip(FIGURES, np.median(values, axis=0))))


if __name__ == "__main__":
    main()
