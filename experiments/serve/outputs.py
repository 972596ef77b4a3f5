"""bench_serve's output folder: the tables it writes after each stage, each stage's packed run
folder, and an earlier output merged in (`--merge DIR`).

A stage's rows are told by their source (serve.csv) or server (overhead.csv): `harness_run` for
the harness's runs, `engine_server_*` and `sim_server_*` for the servers' stages. Merging keeps an
earlier output's rows of the stages not run now and copies their packs beside the new ones, so a
device call cut short in the simulator server's stage is finished by a second call of that stage
alone (`--stages sim --merge EARLIER`), and the folder then reads as one run's (ttft_split,
rebuild, step_prices). The earlier output must be of the same cases: the same workloads and loads
at the same rates (the capacities of `--capacity auto` are the simulator's, made again the same).
"""

from __future__ import annotations

import argparse
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve import host
from experiments.serve.cases import Case
from experiments.serve.tables import markdown

STAGES = ("harness", "engine", "sim")
STAGE_FOLDERS = {"harness": "harness", "engine": "engine_server", "sim": "sim_server"}
# Stages whose step tables leave the device: what the engine measured, step by step, is what the
# simulator's prices are checked against; the simulator's own table is made again on a CPU.
MEASURED_STAGES = ("harness", "engine")
TABLES = ("serve.csv", "overhead.csv", "serve.md")


def pack(out: Path, folder: str) -> None:
    """out/folder as out/folder.tar.gz, the folder removed."""
    if (out / folder).is_dir():
        with tarfile.open(out / f"{folder}.tar.gz", "w:gz") as tar:
            tar.add(out / folder, arcname=folder)
        shutil.rmtree(out / folder)


def drop_steps(folder: Path) -> None:
    """The per-step tables under folder, once summarised (a stage outside MEASURED_STAGES)."""
    for path in folder.rglob("steps.csv.gz"):
        path.unlink()


def stage_of(name: str) -> str:
    """The stage a serve.csv source or an overhead.csv server belongs to."""
    if name == "harness_run":
        return "harness"
    for stage in ("engine", "sim"):
        if name == STAGE_FOLDERS[stage] or name.startswith(f"{STAGE_FOLDERS[stage]}_"):
            return stage
    raise ValueError(f"unknown source or server {name!r} in a bench_serve table")


def write(out: Path, results: dict[str, tuple[list[dict], list[dict]]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """serve.csv, overhead.csv and serve.md of every stage's (rows, overhead rows), in stage order."""
    frame = pd.DataFrame([row for stage in STAGES if stage in results for row in results[stage][0]])
    overhead = pd.DataFrame([row for stage in STAGES if stage in results for row in results[stage][1]])
    frame.to_csv(out / "serve.csv", index=False)
    overhead.to_csv(out / "overhead.csv", index=False)
    (out / "serve.md").write_text(markdown(frame, overhead))
    return frame, overhead


def check_earlier(earlier: Path) -> str | None:
    """Why earlier cannot be merged (one line), or None."""
    if not (earlier / "serve.csv").is_file():
        return f"--merge: {earlier} has no serve.csv (an earlier bench_serve --out, after its first stage)"
    return None


def _read(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):  # overhead.csv after the harness's stage alone
        return pd.DataFrame()


def earlier_results(earlier: Path, now: list[str], cases: list[Case]) -> dict[str, tuple[list[dict], list[dict]]]:
    """The earlier output's rows of the stages not in `now`, by stage; ValueError where its cases
    are not these (a workload or load not planned now, or another rate)."""
    frame, overhead = _read(earlier / "serve.csv"), _read(earlier / "overhead.csv")
    rates = {(c.name, round(c.load, 6)): c.rate for c in cases}
    for row in frame.itertuples():
        key = (row.workload, round(float(row.load), 6))
        if key not in rates or not np.isclose(row.rate_rps, rates[key], rtol=1e-6):
            planned = ", ".join(f"{n} {load:g} at {r:.4g} req/s" for (n, load), r in rates.items())
            raise ValueError(f"--merge: {earlier}'s case {row.workload} {row.load:g} at {row.rate_rps:.4g} req/s is "
                             f"not among this run's ({planned})")
    results: dict[str, tuple[list[dict], list[dict]]] = {}
    for stage in STAGES:
        if stage in now:
            continue
        rows = [r for r in frame.to_dict("records") if stage_of(r["source"]) == stage]
        overheads = [r for r in overhead.to_dict("records") if stage_of(r["server"]) == stage]
        if rows:
            results[stage] = (rows, overheads)
    return results


def copy_packs(earlier: Path, out: Path, stages: list[str]) -> list[str]:
    """The packed run folders of `stages` copied from earlier to out (where they are not the same
    folder); the names copied."""
    copied = []
    for stage in stages:
        name = f"{STAGE_FOLDERS[stage]}.tar.gz"
        if (earlier / name).is_file() and (earlier / name).resolve() != (out / name).resolve():
            shutil.copyfile(earlier / name, out / name)
            copied.append(name)
    return copied


def merged(args: argparse.Namespace, cases: list[Case]) -> dict[str, tuple[list[dict], list[dict]]]:
    """--merge's rows of the stages not run now, its packs copied to --out; SystemExit in one line
    where its cases differ or --sim-host engine finds no engine server step table."""
    results: dict[str, tuple[list[dict], list[dict]]] = {}
    if args.merge is not None:
        try:
            results = earlier_results(args.merge, args.stages, cases)
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
        copied = copy_packs(args.merge, args.out, [s for s in STAGES if s not in args.stages])
        print(f"merged from {args.merge}: rows of {sorted(results) or 'no stage'}; packs {copied or 'none'}",
              flush=True)
    if ("sim" in args.stages and args.sim_host == "engine" and "engine" not in args.stages
            and host.server_steps(args.out, STAGE_FOLDERS["engine"]) is None):
        raise SystemExit(f"error: --sim-host engine: {args.merge} has no engine server step table "
                         "(engine_server.tar.gz); give --sim-host profile or a number")
    return results
