"""A profiling grid fitted with and without the decode kernel's merge of split partials
(sim.decode_merge), both by the same grid-only fit (harness.calibration.fit.fit_calibration's), to
weigh the term side by side: each set of coefficients priced on any run of that model and GPU (the
cost model's builder supplies the kernel). --graph-context: the max_model_len the grid's engine
captured its CUDA graphs for (experiments/fidelity/run_gpu.sh profiles at 16,384). No GPU needed.

    G=experiments/fidelity/code_completion_h200_r2/qwen3-0.6b
    python -m experiments.fidelity.refit_merge $G/profile.csv.gz --model qwen3-0.6b --hardware h200 \\
        --out-merge /tmp/fit_merge.csv --out-plain /tmp/fit_plain.csv

It also prints both fits' errors on the grid's decode rows they did not see (five random 20% splits
of the grid rows, each fitted on the rest), for rows of at most 8 sequences and for all.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.graph_sizes import GraphSizes
from harness.config import ConfigError, load_hardware, model_spec
from sim.config import SimConfig
from sim.cost_model import decode_kernel
from sim.decode_programs import DECODE_MERGE_SPLITS, DecodePrograms
from sim.profiled import ProfiledCostModel

GRID_GRAPH_CONTEXT = 16384  # run_gpu.sh's MAX_MODEL_LEN: the context the grid's graphs were captured for


def kernel_of(model: str, hardware: str) -> DecodePrograms:
    """The engine's decode kernel for a conf/model and conf/hardware name at TP=1 (the cost model's
    builder's, sim.cost_model.decode_kernel)."""
    kernel = decode_kernel(model_spec({"preset": model}), load_hardware(hardware, "--hardware"), SimConfig())
    if kernel is None:
        raise ValueError(f"--hardware {hardware}: no num_sms / decode_program_bandwidth to derive the kernel from")
    return kernel


def refit(profile: pd.DataFrame, kernel: DecodePrograms | None, graph_context: int) -> ProfiledCostModel:
    """The grid rows' fit (host time left out, as the grid-only calibration fits), with the merge term
    where kernel is given."""
    grid = profile[profile["set"] == "grid"] if "set" in profile.columns else profile
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ProfiledCostModel.fit(grid.drop(columns=["host_s"], errors="ignore"),
                                     GraphSizes(decode_context=graph_context), decode_merge=kernel)


def held_out_errors(profile: pd.DataFrame, kernel: DecodePrograms, graph_context: int, splits: int = 5,
                    seed: int = 0) -> pd.DataFrame:
    """Mean |predicted / measured - 1| of the held-out decode rows, plain and with the merge, over
    `splits` random 20% hold-outs of the grid rows (rows of at most 8 sequences, and all)."""
    grid = (profile[profile["set"] == "grid"] if "set" in profile.columns else profile).reset_index(drop=True)
    rng, rows = np.random.default_rng(seed), []
    for split in range(splits):
        held = rng.random(len(grid)) < 0.2
        test = grid[held & (grid["num_prefill_tokens"] == 0).to_numpy()]
        small = (test["num_seqs"] <= 8).to_numpy()
        for name, used in (("plain", None), ("merge", kernel)):
            fitted = refit(grid[~held], used, graph_context)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                err = np.abs(fitted.predict(test) / test["duration_s"].to_numpy() - 1)
            rows.append({"split": split, "fit": name, "small_batches": err[small].mean(), "all_decodes": err.mean()})
    return pd.DataFrame(rows).groupby("fit")[["small_batches", "all_decodes"]].mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", type=Path, help="a profiling grid (profile.csv[.gz])")
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--graph-context", type=int, default=GRID_GRAPH_CONTEXT)
    parser.add_argument("--out-merge", type=Path, required=True)
    parser.add_argument("--out-plain", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        profile = pd.read_csv(args.grid)
        kernel = kernel_of(args.model, args.hardware)
        merged = refit(profile, kernel, args.graph_context)
        plain = refit(profile, None, args.graph_context)
        held_out = held_out_errors(profile, kernel, args.graph_context)
    except (OSError, ValueError, ConfigError, pd.errors.ParserError) as error:
        print(f"refit_merge: {error}", file=sys.stderr)
        return 1
    merged.to_csv(args.out_merge)
    plain.to_csv(args.out_plain)
    for regime, fit in merged.fits.items():
        price = dict(zip(fit.linear_features, fit.linear_coefs)).get(DECODE_MERGE_SPLITS)
        if price is not None:
            print(f"{regime}: {1e6 * price:.2f} us a step per merged split")
    print("held-out grid decode rows, mean |err| (%):")
    print((100 * held_out).round(2).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
