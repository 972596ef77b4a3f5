"""A profiling grid fitted again with the prefill kernel's program term (sim.prefill_programs), as
harness.fidelity.calibrate fits a grid (harness.calibration.fit.validate: the grid-only fit, its
held-out residuals for intervals): the saved coefficients price the term on any run of that model
and GPU (the cost model's builder supplies the kernel's shapes). Writes the coefficients and the
validation table beside each other. No GPU needed.

    G=experiments/fidelity/code_completion_h200_r2/qwen3-0.6b
    python -m experiments.fidelity.refit_programs $G/profile.csv.gz --model qwen3-0.6b --hardware h200 \\
        --out $G/profile_model_programs.csv   # committed gzipped (gzip -n)
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pandas as pd

from harness.calibration.fit import validate
from harness.config import ConfigError, load_hardware, model_spec
from sim.prefill_programs import PrefillPrograms


def refit(grid: pd.DataFrame, model: str, hardware: str, cached_kv: bool = False) -> tuple[pd.DataFrame, object]:
    """(validation table, fitted model) of the grid fitted with the program term of model on hardware
    (cached_kv: and the cached context's K/V bytes)."""
    programs = PrefillPrograms.of(model_spec({"preset": model}), load_hardware(hardware, "--hardware"),
                                  cached_kv=cached_kv)
    if programs is None:
        raise ValueError(f"--hardware {hardware}: no num_sms / prefill_programs_per_sm to derive the programs from")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted, validation = validate(grid, None, (), programs=programs)
    return validation, fitted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("grid", type=Path, help="a profiling grid (profile.csv)")
    p.add_argument("--model", required=True, help="conf/model preset the grid ran (e.g. qwen3-0.6b)")
    p.add_argument("--hardware", required=True, help="conf/hardware name it ran on (e.g. h200)")
    p.add_argument("--out", type=Path, required=True, help="the coefficients (validation beside: *_validation.csv)")
    p.add_argument("--cached-kv", action="store_true",
                   help="fit the cached context's K/V bytes too (sim.prefill_programs, PREFILL_CACHED_KV_BYTES)")
    args = p.parse_args(argv)
    try:
        validation, fitted = refit(pd.read_csv(args.grid), args.model, args.hardware, args.cached_kv)
    except (OSError, ValueError, ConfigError) as error:
        raise SystemExit(f"error: {str(error).splitlines()[0]}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fitted.to_csv(args.out)  # type: ignore[attr-defined]
    validation.to_csv(args.out.with_name(args.out.stem + "_validation.csv"), index=False)
    grid_split = validation[(validation["set"] == "grid_split") & (validation["regime"] == "all")]
    print(grid_split.round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
