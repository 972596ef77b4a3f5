"""Peer simulators side by side: our simulator, NVIDIA's AIConfigurator and Vidur on the same model,
GPU and workload, each beside the engine's committed measurement (docs/results.md, "Peers side by side").

    python -m experiments.peers.compare_peers --aic-venv /work/peers/aic --vidur-venv /work/peers/vidur

Our simulator runs in-process; each peer runs from its own virtual environment as a subprocess (the
project never imports a peer). A peer whose venv is not given or absent is skipped with a message;
a peer that fails is listed with its last error line instead of numbers. Errors are
(tool - engine) / engine. Writes peers.csv and peers.md to --out. The peers' adapters are
static_peers.py (AIConfigurator, GenZ) and vidur_peer.py beside this file.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from experiments.peers.common import COMMON, ENGINE_TOOL, HERE, METRICS, SCENARIOS, Prediction, Scenario
from experiments.peers.static_peers import AIC_TOOL, GENZ_TOOL, aic_estimate, genz_estimate, static_prediction
from experiments.peers.vidur_peer import vidur


def merge(engine: dict[str, float], predictions: Sequence[Prediction]) -> pd.DataFrame:
    """One row per tool and scenario: its figures, its error against the engine for each metric, runtime, note."""
    rows = []
    for p in predictions:
        row: dict[str, object] = {"scenario": p.scenario, "tool": p.tool}
        for m in METRICS:
            value = p.values.get(m, math.nan)
            row[m] = value
            compared = p.tool != ENGINE_TOOL and m in engine and not math.isnan(value)
            row[f"err_{m}"] = (value - engine[m]) / engine[m] if compared else math.nan
        row["runtime_s"] = p.runtime_s
        row["note"] = p.note
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    """The table as docs/results.md shows it: milliseconds for latencies, errors in percent, '-' for none."""
    head = ("| scenario | tool | output tok/s | TTFT P50 (ms) | TTFT P90 (ms) | TPOT P50 (ms) | TPOT P90 (ms) "
            "| runtime (s) |")
    lines = [head, "|" + "---|" * 8]
    for _, r in table.iterrows():
        cells = [str(r["scenario"]), str(r["tool"])]
        for m in METRICS:
            value, err = r[m], r[f"err_{m}"]
            if pd.isna(value):
                cells.append("-")
                continue
            shown = f"{value:,.0f}" if m == "output_tok_s" else f"{value * 1e3:,.1f}"
            cells.append(shown if pd.isna(err) else f"{shown} ({err:+.1%})")
        cells.append("-" if pd.isna(r["runtime_s"]) else f"{r['runtime_s']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r['scenario']}, {r['tool']}: {r['note']}" for _, r in table.iterrows() if r["note"]]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def engine_row(scenario: Scenario) -> Prediction:
    row = pd.read_csv(scenario.engine_summary).iloc[0]
    return Prediction(ENGINE_TOOL, scenario.name, {m: float(row[m]) for m in METRICS},
                      note=f"{scenario.engine_summary.relative_to(HERE.parents[1])}")


def ours(scenario: Scenario, cost_model: str) -> tuple[Prediction, list]:
    """Our simulator with the committed H100 fit (profiled) or no fit (roofline); also returns the
    requests it served (for the peers)."""
    from harness.run import run_once
    from harness.scripting import compose_run_config
    from harness.workloads.build import build_workload

    rc = compose_run_config([*COMMON, f"backend.cost_model={cost_model}", *scenario.overrides])
    requests = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size).requests
    started = time.perf_counter()
    outcome = run_once(rc, progress=False)
    runtime = time.perf_counter() - started
    row = outcome.summary.to_row()
    fit = "the committed H100 fit" if cost_model == "profiled" else "no fit"
    return Prediction(f"this project, {cost_model} ({fit})", scenario.name, {m: float(row[m]) for m in METRICS},
                      runtime), requests


def peer_venv(path: Path | None, name: str) -> Path | None:
    if path is None or not (path / "bin" / "python").exists():
        print(f"skipping {name}: no venv at {path} (see docs/results.md, 'Peers side by side', for the install)")
        return None
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aic-venv", type=Path, help="venv with aiconfigurator==0.12.0")
    parser.add_argument("--vidur-venv", type=Path, help="venv with vidur==0.0.26")
    parser.add_argument("--genz-venv", type=Path, help="venv with genz-llm==0.0.16")
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, default=HERE, help="folder for peers.csv and peers.md")
    args = parser.parse_args(argv)
    aic_venv, vidur_venv = peer_venv(args.aic_venv, "AIConfigurator"), peer_venv(args.vidur_venv, "Vidur")
    genz_venv = peer_venv(args.genz_venv, "GenZ")
    tables = []
    for name in args.scenarios:
        scenario = SCENARIOS[name]
        engine = engine_row(scenario)
        profiled, requests = ours(scenario, "profiled")
        predictions = [engine, profiled, ours(scenario, "roofline")[0]]
        isl = round(sum(len(r.prompt_token_ids) for r in requests) / len(requests))
        osl = round(sum(r.sampling_params.max_tokens for r in requests) / len(requests))
        if aic_venv is not None:
            predictions.append(static_prediction(AIC_TOOL, aic_estimate(aic_venv, isl, osl), scenario, isl, osl,
                                                 len(requests)))
        if genz_venv is not None:
            predictions.append(static_prediction(GENZ_TOOL, genz_estimate(genz_venv, isl, osl), scenario, isl, osl,
                                                 len(requests)))
        if vidur_venv is not None:
            predictions.append(vidur(vidur_venv, scenario, requests))
        tables.append(merge(engine.values, predictions))
    table = pd.concat(tables, ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "peers.csv", index=False)
    (args.out / "peers.md").write_text(markdown(table))
    print(markdown(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
