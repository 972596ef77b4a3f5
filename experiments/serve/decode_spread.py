"""Whether a served case's decode steps run over their price the more ragged their running set is.

    python -m experiments.serve.decode_spread OUT --case azure_80 [--trace-dir DIR] [--set KEY=VALUE ...]

OUT: bench_serve's --out folder (harness.tar.gz and engine_server.tar.gz, or the folders they
pack), or a harness pack folder (plan.json and <case>/). For the harness's own run of the case and,
where OUT has one, the engine server's: every decode CUDA-graph step of its steps.csv.gz, with the
contexts of its running set reconstructed from requests.csv (each request decoding at the step's
start, its prompt plus the tokens it had decoded by then at its own mean pace), priced by the case's
profiled model from the step's recorded features, plus what the decode kernel's longest programs
add for those contexts (sim.decode_programs, with the --set settings: e.g.
`hardware.decode_programs_per_sm=5 backend.decode_programs_baseline=grid_spread`). Printed: each
source's core TPOT P50 by when its requests arrived (thirds of the case); per source, (priced /
measured - 1), median and summed, with the context CV's median, by batch size (--batch-bins) and by
the quartiles of the running set's context CV (standard deviation over mean), the latter for steps
of at least --min-seqs sequences. The profile's grid spreads a decode row's contexts evenly over
[mean / 2, 3 mean / 2], a CV of 0.29.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve import host
from experiments.serve.split_inputs import unpack
from experiments.serve.step_prices import SIM, case_overrides
from experiments.serve.tables import case_requests
from experiments.serve.ttft_split import client_records
from harness.compare.tables import markdown
from harness.run import make_executor
from harness.scripting import compose_run_config
from sim.decode_programs import PROGRAM_EXCESS
from sim.profiled_regimes import regime_of
from sim.profiled_validation import priced_measurement

BATCHES = (0, 16, 32, 48, 64, 96, 128, 192, 512)


def running_contexts(requests: pd.DataFrame, start: float) -> np.ndarray:
    """The contexts the requests decoding at `start` read: prompt, the first token, and the tokens
    decoded since at the request's mean pace."""
    first, finish = requests["first_token"].to_numpy(float), requests["finish"].to_numpy(float)
    on = (first <= start) & (finish > start)
    steps = requests["output_tokens"].to_numpy(int)[on] - 1
    done = np.floor((start - first[on]) / np.maximum(finish[on] - first[on], 1e-9) * steps)
    return (requests["prompt_tokens"].to_numpy(int)[on] + 1 + done).astype(np.int64)


def priced(requests: pd.DataFrame, steps: pd.DataFrame, overrides: list[str]) -> pd.DataFrame:
    """The decode graph steps of a run with their reconstructed contexts' CV, measured and priced."""
    executor = make_executor(compose_run_config([*SIM, *overrides]))
    model, context = executor.cost_model, executor.info().graph_sizes.decode_context
    table = steps.rename(columns={"duration": "duration_s"})
    table = table[[regime_of(row) == "decode_graph" for row in table.to_dict("records")]].copy()
    fit = model.fits["decode_graph"]
    per_token = dict(zip(fit.linear_features, fit.linear_coefs)).get("decode_context_tokens", 0.0)
    programs = model.decode_programs
    cvs, excess = [], []
    for start, batch in zip(table["start"], table["graph_batch_size"], strict=True):
        lens = running_contexts(requests, float(start))
        cvs.append(float(lens.std() / lens.mean()) if lens.size > 1 else 0.0)
        graph = (int(batch), context) if context else None
        excess.append(programs.step_excess_s(lens.tolist(), per_token, graph) if programs and lens.size else 0.0)
    table[PROGRAM_EXCESS] = excess
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # extrapolation: the steps are what they are
        table["priced"] = model.predict(table)
    return table.assign(measured=priced_measurement(table), cv=cvs)


def error_table(table: pd.DataFrame, by: pd.Series) -> pd.DataFrame:
    groups = table.groupby(by, observed=True)
    return pd.DataFrame({"steps": groups.size(), "cv_median": groups["cv"].median().round(3),
                         "median_err_pct": groups.apply(lambda g: 100 * ((g.priced / g.measured).median() - 1)),
                         "sum_err_pct": groups.apply(lambda g: 100 * (g.priced.sum() / g.measured.sum() - 1))})


def tpot_by_arrival(requests: pd.DataFrame, parts: int = 3) -> dict[str, float]:
    """TPOT P50 (ms) of the requests arriving in each of `parts` equal stretches of the case, and all."""
    since = requests["arrival"] - requests["arrival"].min()
    stretch = pd.cut(since, np.linspace(0, since.max() + 1e-9, parts + 1), include_lowest=True)
    figures = {f"tpot_p50_ms {k + 1}/{parts}": float(g.median() * 1e3)
               for k, (_, g) in enumerate(requests.groupby(stretch, observed=False)["tpot"])}
    return {**figures, "tpot_p50_ms": float(requests["tpot"].median() * 1e3)}


def sources(out: Path, tmp: Path, case: str) -> tuple[list[str], dict[str, tuple[pd.DataFrame, pd.DataFrame]]]:
    """The case's overrides and each source's (requests, steps): the harness's run, and the engine
    server's case (its requests by the client's records, its steps in their window) where OUT has it."""
    pack = out if (out / "plan.json").is_file() else unpack(out, tmp, ("harness",))["harness"]
    overrides = case_overrides(pack, case)
    runs = {"harness_run": (pd.read_csv(pack / case / "requests.csv"), pd.read_csv(pack / case / "steps.csv.gz"))}
    steps = host.server_steps(out, "engine_server")
    if steps is not None:
        folder = unpack(out, tmp, ("engine_server",))["engine_server"]
        tags = [Path(entry["out"]).name for entry in json.loads((pack / "plan.json").read_text())]
        records = [client_records(folder, tag) for tag in tags]  # the cases ran one after the other
        requests = case_requests(pd.read_csv(folder / "requests.csv"), [len(r) for r in records],
                                 records)[tags.index(case)]
        runs["engine_server"] = (requests, host.in_window(steps, requests["arrival"].min(), requests["finish"].max()))
    return overrides, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="bench_serve's --out folder, or a harness pack folder")
    parser.add_argument("--case", required=True, help="a case, as azure_80")
    parser.add_argument("--trace-dir", default=None, help="folder of the trace files (default: the case's)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="backend.* or hardware.* settings of the simulator to price with")
    parser.add_argument("--batch-bins", type=int, nargs="+", default=list(BATCHES), metavar="EDGE",
                        help=f"the batch-size table's bin edges, ascending (default {' '.join(map(str, BATCHES))}; "
                        "e.g. 59 66 72 78 82 86 90 95 100 around 83 sequences, 664 programs of 8 KV heads)")
    parser.add_argument("--min-seqs", type=int, default=48,
                        help="the CV table's smallest batch (default 48: memory-bound, past the host-bound sizes)")
    args = parser.parse_args(argv)
    bad = [o for o in args.set if not o.startswith(("backend.", "hardware.")) or "=" not in o]
    if bad:
        parser.error(f"--set: {bad}: give backend.<field>=<value> or hardware.<field>=<value> settings")
    if len(args.batch_bins) < 2 or any(b <= a for a, b in zip(args.batch_bins, args.batch_bins[1:])):
        parser.error(f"--batch-bins: give at least two ascending edges, got {args.batch_bins}")
    if not args.out.exists():
        parser.error(f"no such folder: {args.out}")
    with tempfile.TemporaryDirectory() as tmp:
        overrides, runs = sources(args.out, Path(tmp), args.case)
    overrides = [o for o in overrides if not (args.trace_dir and o.startswith("workload.trace_dir="))]
    overrides += [f"workload.trace_dir={Path(args.trace_dir).resolve()}"] if args.trace_dir else []
    print(markdown(pd.DataFrame({name: tpot_by_arrival(requests) for name, (requests, _) in runs.items()}).T
                   .rename_axis("source").reset_index().round(2)))
    for name, (requests, steps) in runs.items():
        table = priced(requests, steps, [*overrides, *args.set])
        print(f"\n## {args.case}, {name}: {len(table)} decode graph steps, context CV median {table.cv.median():.2f}\n")
        print(markdown(error_table(table, pd.cut(table.num_seqs, args.batch_bins)).reset_index().round(2)), "\n")
        large = table[table.num_seqs >= args.min_seqs]
        print(f"steps of at least {args.min_seqs} sequences ({len(large)}), by context CV:\n")
        if len(large):
            print(markdown(error_table(large, pd.qcut(large.cv, 4, duplicates="drop")).reset_index().round(2)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
