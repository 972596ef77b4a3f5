"""A call's cells simulated again with one kind of step priced differently, against the engine's
values: which uniform or per-kind price change would bring a class's cells in, when no step
replays came back. Each variant: all=F (every step x F), prefill=F (prefill steps), decode=F,
added=S (S seconds more a step), or <part>:<regime>=F (that part's fit in the profile, a host part
or the device time: launch:prefill=1.3, the eager prefill's launches; gpu:prefill=1.03, its device
time), or knot:<regime>@<size>=F (one knot of a fit, e.g. knot:decode_graph@4=0.875, the decode
graph of batch 4); profile changes joined by "+" make one variant
(gpu:prefill=1.026+gpu:prefill_graph=1.008). --host-scales (resimulate.py's: a row per engine
repeat) prices each cell at each repeat's measured host and averages, as the held-out table does.
A variant fitted on a held-out call's own engine values is a diagnosis, never a model. No GPU needed.

    python -m experiments.fidelity.price_sensitivity experiments/fidelity/code_completion_h200/qwen3-8b/heldout.csv \
        experiments/fidelity/h200/qwen3-8b_from_h100.csv --model qwen3-8b --hardware h200 --num-blocks 3002 \
        --num-requests 250 --variants all=1.044 prefill=1.03 --out /tmp/price_8b.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from experiments.fidelity.code_completion_cpu import simulate
from experiments.fidelity.resimulate import MAX_MODEL_LEN, cell_config, host_scales
from harness.compare.study import sim_run_config
from harness.convert import ConfigError
from harness.fidelity.report import PLOTTED, rel_error
from harness.scripting import compose_run_config, one_line_errors
from sim.profiled import HOST_PARTS

OFFLINE = ("request_s", "ttft_p50_s", "tpot_p50_s")
STEP_KINDS = {"all": (1, 1), "prefill": (1, 0), "decode": (0, 1)}
KNOT = "knot:"  # one knot of a fit: knot:<regime>@<size>
FIT_PARTS = ("gpu", *HOST_PARTS)  # the parts of a regime a profile fits apart (sim.profiled_overlap)


def parse_variant(text: str) -> tuple[tuple[float, float, float], tuple[str, float] | None]:
    """((prefill factor, decode factor, added seconds), (profile regime to scale, factor) or None)."""
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not sep or number != number:
        raise ConfigError(f"--variants: expected NAME=NUMBER, got {text!r}")
    if name in STEP_KINDS:
        on_prefill, on_decode = STEP_KINDS[name]
        return (number if on_prefill else 1.0, number if on_decode else 1.0, 0.0), None
    if name == "added":
        return (1.0, 1.0, number), None
    if name.partition(":")[0] in FIT_PARTS:
        return (1.0, 1.0, 0.0), (name, number)
    if name.startswith(KNOT):
        _, at, size = name.partition("@")
        try:
            float(size)
        except ValueError:
            at = ""
        if not at:
            raise ConfigError(f"--variants: expected {KNOT}<regime>@<size>=NUMBER, got {text!r}")
        return (1.0, 1.0, 0.0), (name, number)
    raise ConfigError(f"--variants: unknown {name!r}; known: {', '.join(STEP_KINDS)}, added, "
                      f"{', '.join(p + ':<regime>' for p in FIT_PARTS)}, {KNOT}<regime>@<size>")


def parse_variants(text: str) -> tuple[tuple[float, float, float], list[tuple[str, float]]]:
    """A variant of one step change or of profile changes joined by "+" (module docstring)."""
    parts = [parse_variant(part) for part in text.split("+")]
    if len(parts) > 1 and any(host is None for _, host in parts):
        raise ConfigError(f"--variants: only profile changes (<part>:<regime>, {KNOT}...) join with '+', got {text!r}")
    return parts[0][0], [host for _, host in parts if host is not None]


def scaled_profile(profile: Path, changes: list[tuple[str, float]], folder: Path) -> Path:
    """A copy of the profile with each named fit's knots and coefficients scaled by its factor
    (knot:<regime>@<size>: that knot alone)."""
    table = pd.read_csv(profile)
    for regime, factor in changes:
        if regime.startswith(KNOT):
            name, _, size = regime.removeprefix(KNOT).partition("@")
            rows = (table["regime"] == name) & (table["kind"] == "knot") & (table["x"] == float(size))
        else:
            rows = (table["regime"] == regime) & table["kind"].isin(["knot", "linear"])
        if not rows.any():
            raise ConfigError(f"--variants: the profile has no fit {regime!r}")
        table.loc[rows, "value"] *= factor
    name = "+".join(f"{regime}_x{factor}" for regime, factor in changes)
    path = folder / f"{name.replace(':', '_').replace('@', '_')}.csv"
    table.to_csv(path, index=False)
    return path


def every_price_scaled(profile: Path, factor: float, folder: Path) -> Path:
    """A copy of the profile with every fit's knots and coefficients and its time constants scaled by
    factor: every step it prices costs factor times as much (a price is sums and maxima of those
    parts, with no offset of its own), as the all=F variant prices them."""
    table = pd.read_csv(profile)
    table.loc[table["kind"].isin(["knot", "linear", "constant"]), "value"] *= factor
    path = folder / f"every_price_x{factor:g}.csv"
    table.to_csv(path, index=False)
    return path


# the profile regimes whose fits price each kind of step (their overlap parts too: "<part>:<regime>")
KIND_REGIMES = {"prefill": ("prefill", "prefill_graph"), "decode": ("decode_graph", "decode_eager")}


def kind_scaled(profile: Path, kind: str, factor: float, folder: Path) -> Path:
    """A copy of the profile with the knots and coefficients of every fit that prices one kind of
    step (KIND_REGIMES: the regime's own fit and its launch, gpu and lead parts) scaled by factor.
    A step of the other kind costs what it did; a decode graph step, or a prefill graph step
    priced by its device time, costs factor times as much (an eager step about that much: the host
    time its predecessor leaves free is not scaled)."""
    if kind not in KIND_REGIMES:
        raise ConfigError(f"kind must be one of {', '.join(KIND_REGIMES)}, got {kind!r}")
    table = pd.read_csv(profile)
    regimes = table["regime"].str.rpartition(":")[2]
    rows = regimes.isin(KIND_REGIMES[kind]) & table["kind"].isin(["knot", "linear"])
    table.loc[rows, "value"] *= factor
    path = folder / f"{kind}_price_x{factor:g}.csv"
    table.to_csv(path, index=False)
    return path


def sensitivity(table: pd.DataFrame, profile: Path, overrides: list[str], num_blocks: int, num_requests: int,
                variants: list[str], hosts: dict[tuple[str, str], list[tuple[float, float]]] | None = None
                ) -> pd.DataFrame:
    """Each cell simulated with the fit and with each variant; hosts: each cell's engine repeats'
    (resimulate.host_scales), simulated at each and averaged (cells without one: the profile's)."""
    base = compose_run_config(overrides + [f"scheduler.max_model_len={MAX_MODEL_LEN}"])
    reference = table[table["cost_model"] == table["cost_model"].iloc[0]]
    meta = {"num_blocks": num_blocks, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        plans = [("fit", (1.0, 1.0, 0.0), profile)]
        for text in variants:
            change, fits = parse_variants(text)
            plans.append((text, change, scaled_profile(profile, fits, Path(folder)) if fits else profile))
        cells = list(reference.groupby(["workload", "load"], sort=False))
        for (workload, load), part in tqdm(cells, desc="price sensitivity", unit="cell"):
            rc = cell_config(base, workload, str(load), float(part["rate_req_s"].iloc[0]), num_requests, None)
            engine = part.set_index("metric")["engine"]
            scales = [scale for scale, _ in (hosts or {}).get((str(workload), str(load)), [(1.0, 0.0)])]
            for label, change, path in plans:
                sim_rc = sim_run_config(rc, "profiled", str(path), meta)
                summaries = [simulate(dataclasses.replace(sim_rc, sim=dataclasses.replace(
                    sim_rc.sim, execution=base.sim.execution, host_scale=scale)), change).summary for scale in scales]
                for metric in OFFLINE if str(load) == "offline" else PLOTTED:
                    sim, measured = sum(float(s[metric]) for s in summaries) / len(summaries), float(engine[metric])
                    rows.append({"workload": workload, "load": str(load), "variant": label, "metric": metric,
                                 "engine": measured, "sim": sim, "err": rel_error(sim, measured)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="a call's heldout.csv (the engine's values and rates)")
    parser.add_argument("profile", type=Path, help="the profiled model (model.csv) to change")
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--num-blocks", type=int, required=True, help="the engine's KV blocks (the call's log)")
    parser.add_argument("--num-requests", type=int, required=True)
    parser.add_argument("--variants", nargs="+", required=True, help="NAME=NUMBER (module docstring)")
    parser.add_argument("--host-scales", type=Path, default=None,
                        help="resimulate.py's CSV of each engine repeat's host (workload, load, host_scale)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    def run() -> int:
        for text in args.variants:
            parse_variants(text)
        overrides = [f"model={args.model}", f"hardware={args.hardware}", "backend=sim"]
        result = sensitivity(pd.read_csv(args.table), args.profile, overrides, args.num_blocks, args.num_requests,
                             args.variants, None if args.host_scales is None else host_scales(args.host_scales))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result.to_csv(args.out, index=False)
        shown = result.pivot_table(index=["load", "metric"], columns="variant", values="err", sort=False)
        print((100 * shown[["fit", *args.variants]]).round(1).to_string())
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
