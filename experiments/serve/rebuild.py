"""serve.md again from a bench_serve --out folder that a run left partial (a device call cut short
while a server's stage ran, so that stage never wrote its rows):

    python -m experiments.serve.rebuild OUT [--to DIR]

The rows serve.csv and overhead.csv hold are kept as they are; for a server folder with no rows
yet (`<server>/`, not packed: its stage did not finish), each case whose aiperf report is complete
(`<server>/aiperf_<tag>/profile_export_aiperf.json`) adds that server's `<server>_aiperf` row, with
aiperf's own percentiles as bench_serve takes them (experiments/serve/aiperf.figures). The rest of a
stage's rows need what its server writes as it stops (requests.csv: the `own` row, the overhead,
the `late_max_ms` schedule), so they stay missing. serve.csv, overhead.csv and serve.md go to DIR
(default OUT).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from experiments.serve import aiperf
from experiments.serve.outputs import STAGE_FOLDERS
from experiments.serve.tables import markdown

SERVERS = (STAGE_FOLDERS["engine"], STAGE_FOLDERS["sim"])


def tag_case(tag: str) -> tuple[str, int]:
    """A case's tag (experiments/serve/cases.Case.tag, `azure_50`) as (workload, load in percent)."""
    name, _, percent = tag.rpartition("_")
    if not name or not percent.isdigit():
        raise ValueError(f"aiperf folder tag {tag!r}: expected <workload>_<load percent>, as azure_50")
    return name, int(percent)


def report_rows(out: Path, frame: pd.DataFrame) -> list[dict]:
    """The `<server>_aiperf` rows of each complete aiperf report of a server that has no rows in
    frame (serve.csv); the case's rate from frame's row of the same case."""
    rows = []
    for server in SERVERS:
        if not (out / server).is_dir() or frame["source"].str.startswith(f"{server}_").any():
            continue
        for path in sorted((out / server).glob(f"aiperf_*/{aiperf.REPORT}")):
            report = json.loads(path.read_text())
            failed = (report.get("error_request_count") or {}).get("avg", 0)
            if report.get("was_cancelled") or not report.get("is_complete", True) or failed:
                print(f"{path}: left out (cancelled, incomplete or {failed:.0f} requests failed)")
                continue
            name, percent = tag_case(path.parent.name.removeprefix("aiperf_"))
            same = frame[(frame["workload"] == name) & ((frame["load"] * 100).round() == percent)]
            if same.empty:
                raise ValueError(f"{path}: no case {name} at {percent}% in serve.csv")
            rows.append({"workload": name, "load": same["load"].iloc[0], "rate_rps": same["rate_rps"].iloc[0],
                         "source": f"{server}_aiperf", "requests": int(report["request_count"]["avg"]),
                         **aiperf.figures(report)})
    return rows


def rebuild(out: Path, to: Path) -> pd.DataFrame:
    """serve.csv with report_rows added, written to `to` with overhead.csv and serve.md."""
    frame = pd.read_csv(out / "serve.csv")
    overhead = pd.read_csv(out / "overhead.csv") if (out / "overhead.csv").is_file() else pd.DataFrame()
    frame = pd.concat([frame, pd.DataFrame(report_rows(out, frame))], ignore_index=True)
    to.mkdir(parents=True, exist_ok=True)
    frame.to_csv(to / "serve.csv", index=False)
    if len(overhead):
        overhead.to_csv(to / "overhead.csv", index=False)
    (to / "serve.md").write_text(markdown(frame, overhead))
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="bench_serve's --out folder")
    parser.add_argument("--to", type=Path, default=None, help="where the tables go (default: OUT)")
    args = parser.parse_args(argv)
    if not (args.out / "serve.csv").is_file():
        parser.error(f"{args.out} has no serve.csv (bench_serve's --out, after its first stage)")
    try:
        rebuild(args.out, args.to or args.out)
    except ValueError as error:
        parser.error(str(error))
    print(((args.to or args.out) / "serve.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
