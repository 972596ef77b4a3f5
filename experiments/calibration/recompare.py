"""Compare again, without a GPU: the engine runs saved by calibrate_and_compare.py against the
simulator with another calibration (e.g. one refitted by refit.py).

  python experiments/calibration/recompare.py $OUT/qwen3_0_6b --profile $OUT/qwen3_0_6b/refit/model.csv \
      --out $OUT/qwen3_0_6b/refit

For each compare_<name>/ of the folder, the workload overrides recorded in meta.json are composed
again (the saved engine.json must match them: harness.compare.study checks) and harness.compare.study runs with
compare.engine_dir = that folder's engine/ run. The simulator side is deterministic, so the same
command always writes the same tables.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.compare.study import CompareConfig, compare
from harness.scripting import compose_run_config, one_line_errors, require, steps_table_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--profile", type=Path, required=True, help="calibration for the profiled model")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None, help="compare_<name> stages to redo (default: all)")
    args = parser.parse_args(argv)
    return one_line_errors(lambda: recompare(args))


def recompare(args: argparse.Namespace) -> int:
    meta = json.loads(require(args.folder / "meta.json").read_text())
    base = [o for o in meta["overrides"] if not o.startswith("backend.")] + ["backend=sim"]
    for stage, info in meta["stages"].items():
        engine_dir = args.folder / stage / "engine"
        if not stage.startswith("compare_") or not engine_dir.is_dir():
            continue
        if args.only is not None and stage not in args.only:
            continue
        extra = [o for o in info["overrides"] if "=" in o]
        steps_table_path(engine_dir)  # the saved engine run's raw tables must be in the tree
        rc = compose_run_config(base + extra)
        cc = CompareConfig(profile_path=str(args.profile), engine_dir=str(engine_dir))
        result = compare(rc, cc, args.out / stage, plots=True)
        print(f"== {stage}: {' '.join(extra)}")
        print(result.report.split("## Metrics")[0].split("## Schedules")[1].strip())
        table = result.table.set_index("metric")
        print(table.loc[["output_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "replay_busy_s",
                         "replay_step_abs_err_median"]].to_string(float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
