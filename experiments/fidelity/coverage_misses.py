"""Why a model-and-load group of the held-out table misses its 90% coverage: per group, how the
raw errors and the conformal scores (harness.fidelity.conformal) spread, and which classes the
cells outside their conformalised interval belong to. No GPU needed.

    python experiments/fidelity/coverage_misses.py experiments/fidelity/heldout.csv.gz

Writes nothing; prints three tables: per group the |ln(sim / engine)| median and 90th percentile
beside the interval's log half-width and the scores' 90th percentile (a score grows with load only
if the errors outgrow the propagated interval) and the largest ratio of the engine's repeat range
to the propagated interval's range (below 1: the interval is wider than the engine's own
run-to-run noise); then per group and class the cells outside; then each cell outside, with how
far its engine value and the repeat nearest the interval lie beyond the conformalised interval
(a cell whose nearest repeat is also outside is not missed for the engine's noise).

    python experiments/fidelity/coverage_misses.py experiments/fidelity/heldout.csv.gz --noise 0.5 1

adds, per factor, the counterfactual of widening each propagated interval in log space by the factor
times its own cell's repeat range before the conformal step: per group the conformal coverage and
the median width ln(hi / lo) without and with it. The cell's repeat range is part of the measurement
the interval predicts, so such an interval is not a prediction interval; it says how much of a
miss the engine's noise could explain.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.fidelity.conformal import GROUP, leave_one_class_out, scores
from harness.fidelity.report import LOAD_METRICS
from harness.scripting import one_line_errors


def spreads(cells: pd.DataFrame) -> pd.DataFrame:
    """Per group: cells, classes, |log error| median and P90, interval log half-width median, score
    P90 and the largest engine repeat range over the propagated interval's range."""
    spread = cells["engine_spread"] if "engine_spread" in cells else pd.Series(np.nan, index=cells.index)
    cells = cells.assign(abs_log_err=np.abs(np.log(cells["sim"] / cells["engine"])),
                         log_half_width=np.log(cells["sim_hi"] / cells["sim_lo"]) / 2, score=scores(cells),
                         noise_over_width=spread * cells["engine"] / (cells["sim_hi"] - cells["sim_lo"]))
    return cells.groupby(GROUP).agg(cells=("score", "size"), classes=("workload", "nunique"),
                                    abs_log_err_p50=("abs_log_err", "median"),
                                    abs_log_err_p90=("abs_log_err", lambda s: s.quantile(0.9)),
                                    log_half_width_p50=("log_half_width", "median"),
                                    score_p90=("score", lambda s: s.quantile(0.9)),
                                    noise_over_width_max=("noise_over_width", "max"))


def nearest_repeat(engine: pd.Series, spread: pd.Series, repeats: pd.Series, above: pd.Series) -> pd.Series:
    """The engine repeat nearest the interval, at its bound: R repeats of mean m and range
    r = spread m lie within m -+ r (R - 1) / R (exactly m -+ r / 2 for two), so the lowest repeat of
    a cell above its interval is at least m - r (R - 1) / R (the highest of one below, at most the
    mirror). One repeat: the mean itself."""
    count = repeats.fillna(1).clip(lower=1)
    reach = spread.fillna(0) * engine * (count - 1) / count
    return engine - reach.where(above, -reach)


def outside_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Each cell outside its conformalised interval (groups with too few cells left out): its error,
    repeats and repeat range, beyond_pct (how far, relative, the engine value lies outside the
    widened interval's nearer edge) and nearest_repeat_beyond_pct (the same for the repeat nearest
    the interval; negative where that repeat could lie inside)."""
    out = leave_one_class_out(cells)
    out = out[out["in_interval_conformal"].notna()]
    out = out[~out["in_interval_conformal"].astype(bool)]
    above = out["engine"] > out["sim_hi_conformal"]
    edge = out["sim_hi_conformal"].where(above, out["sim_lo_conformal"])
    nearest = nearest_repeat(out["engine"], out["engine_spread"], out["engine_repeats"], above)
    sign = np.where(above, 1.0, -1.0)
    return out.assign(beyond_pct=100 * sign * (out["engine"] / edge - 1),
                      nearest_repeat_beyond_pct=100 * sign * (nearest / edge - 1))[
        [*GROUP, "workload", "metric", "err", "engine_repeats", "engine_spread", "conformal_margin",
         "beyond_pct", "nearest_repeat_beyond_pct"]].set_index([*GROUP, "workload", "metric"]).sort_index()


def misses(cells: pd.DataFrame) -> pd.DataFrame:
    """Per group and class: cells outside the conformalised interval (groups with too few cells left out)."""
    out = leave_one_class_out(cells)
    claimed = out[out["in_interval_conformal"].notna()]
    outside = ~claimed["in_interval_conformal"].astype(bool)
    return (claimed.assign(outside=outside).groupby([*GROUP, "workload"])
            .agg(cells=("outside", "size"), outside=("outside", "sum"), margin=("conformal_margin", "first"))
            .query("outside > 0"))


def noise_counterfactual(cells: pd.DataFrame, factor: float) -> pd.DataFrame:
    """Per group: conformal coverage and median width ln(hi / lo) of the conformalised intervals, as
    they are and with each propagated interval first widened by factor x its cell's engine_spread."""
    if not factor >= 0:
        raise ValueError(f"--noise must be >= 0, got {factor}")
    widen = np.exp(factor * cells["engine_spread"].fillna(0).astype(float))
    sides = {"": cells, f"_noise_x{factor:g}": cells.assign(sim_lo=cells["sim_lo"] / widen,
                                                          sim_hi=cells["sim_hi"] * widen)}
    parts = []
    for suffix, table in sides.items():
        out = leave_one_class_out(table)
        out = out.assign(width=np.log(out["sim_hi_conformal"] / out["sim_lo_conformal"]))
        claimed = out[out["in_interval_conformal"].notna()]
        parts.append(claimed.groupby(GROUP).agg(
            **{f"coverage{suffix}": ("in_interval_conformal", lambda s: s.astype(bool).mean()),
               f"inside{suffix}": ("in_interval_conformal", lambda s: int(s.astype(bool).sum())),
               f"width_p50{suffix}": ("width", "median")}))
    return pd.concat(parts, axis=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="the merged heldout.csv")
    parser.add_argument("--noise", type=float, nargs="*", default=[],
                        help="factors of each cell's repeat range to widen its interval by (a counterfactual)")
    args = parser.parse_args(argv)
    if any(not factor >= 0 for factor in args.noise):
        parser.error(f"--noise factors must be >= 0, got {args.noise}")

    def run() -> int:
        table = pd.read_csv(args.table, dtype={"load": str})
        cells = table[(table["cost_model"] == "profiled") & table["metric"].isin(LOAD_METRICS)
                      & table["in_interval"].notna()]
        pd.set_option("display.width", 200)
        print(spreads(cells).round(3).to_string())
        print()
        print(misses(cells).round(3).to_string())
        print()
        print(outside_cells(cells).round(3).to_string())
        for factor in args.noise:
            print()
            print(noise_counterfactual(cells, factor).round(3).to_string())
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
