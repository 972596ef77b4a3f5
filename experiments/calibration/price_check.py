"""Which fit describes served graph steps: the span of back-to-back repeats, or the device time?

  python experiments/calibration/price_check.py h100_run5

For each model of the run and each comparison's recorded engine run, sums the measured duration
of its prefill graph steps and of its decode graph steps, and what each of the run's two fits
(the regime's span fit, its "gpu:" device-time fit) gives them: (fit - measured) / measured.
No GPU; reads each model's fit (its folder's model.csv, or the shipped profile the run produced,
profiles/<hardware>/<model>.csv, named by its meta.json) and compare_<workload>/engine/steps.csv(.gz),
which the tree keeps for no run (experiments/README.md): check out commit e869d52 for run 5's.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import pandas as pd

from engine.core.model_shapes import RENAMED
from harness.scripting import read_steps, require
from sim.profiled import ProfiledCostModel, complete_columns, table_regimes

ROOT = Path(__file__).resolve().parent


def fit_of(model_dir: Path) -> Path | None:
    """The model's fit: model.csv beside its runs, else the shipped profile of the hardware and
    model its meta.json names (a run whose fits became the shipped profiles); None if neither."""
    if (model_dir / "model.csv").is_file():
        return model_dir / "model.csv"
    if not (model_dir / "meta.json").is_file():
        return None
    settings = dict(o.split("=", 1) for o in json.loads((model_dir / "meta.json").read_text())["overrides"])
    model = RENAMED.get(settings["model"], settings["model"])
    shipped = ROOT.parents[1] / "profiles" / settings.get("hardware", "h100") / f"{model}.csv"
    return shipped if shipped.is_file() else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", default="h100_run5", help="run folder under experiments/calibration/")
    run = require(ROOT / parser.parse_args(argv).run)
    rows = []
    for model_dir in sorted(p for p in run.iterdir() if p.is_dir() and fit_of(p) is not None):
        model = ProfiledCostModel.load(fit_of(model_dir))
        for engine_dir in sorted(model_dir.glob("compare_*/engine")):
            steps = complete_columns(read_steps(engine_dir).rename(columns={"duration": "duration_s"}))
            regimes = table_regimes(steps)
            records = steps.to_dict("records")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                span = pd.Series([model.predict_features(r) for r in records], index=steps.index)
                device = pd.Series([model._part("gpu", r) for r in records], index=steps.index)
            for regime in ("prefill_graph", "decode_graph"):
                mask = regimes == regime
                if not mask.any():
                    continue
                measured = steps.loc[mask, "duration_s"].sum()
                rows.append({"model": model_dir.name, "workload": engine_dir.parent.name.removeprefix("compare_"),
                             "regime": regime, "steps": int(mask.sum()), "measured_s": round(measured, 3),
                             "span_fit_err": f"{100 * (span[mask].sum() / measured - 1):+.1f}%",
                             "device_fit_err": f"{100 * (device[mask].sum() / measured - 1):+.1f}%"})
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
