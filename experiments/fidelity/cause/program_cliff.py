"""Is the decode kernel's cliff (sim.decode_programs) priced as the engine ran it? Two sides, by the
decode step's sequence count around 33 (two programs per SM for 8 KV heads on 132 SMs):
- the engine: a call's step replays, its decode graph steps' measured time minus the profile's
  price without the programs (the replays were priced before them), median per bin;
- the simulator: the same call's cells simulated again, the wait the model adds to each decode
  step (DecodePrograms.excess_s), median per bin, with the steps' mean context.
A jump in the engine's residual from 31-32 to 33 sequences the size of the model's wait says the
cliff is there and priced at that size. No GPU needed; the replays are a device call's raw
<class>_<load>_<repeat>.csv.gz (not committed: host_scales.py reads the same).

    python -m experiments.fidelity.cause.program_cliff /work/wt/cc_h100/qwen3-0.6b/code_completion/steps \
        experiments/fidelity/code_completion_h100/qwen3-0.6b/heldout.csv \
        experiments/fidelity/h100_leakfree/profile_model.csv \
        --model qwen3-0.6b --hardware h100 --num-blocks 2422 --num-requests 1000 \
        --out experiments/fidelity/code_completion_h100/qwen3-0.6b/program_cliff.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.fidelity.cause.resimulated_cell import base_config, profiled_cell, simulate_cell

BINS = (0, 16, 28, 32, 33, 34, 36, 40, 48, 64, 128, 512)


def engine_side(steps_dir: Path) -> pd.DataFrame:
    """The replays' decode graph steps: num_seqs, mean context, measured minus priced (s)."""
    frames = [pd.read_csv(path) for path in sorted(steps_dir.glob("*_[0-9]*.csv.gz"))]
    if not frames:
        raise ValueError(f"{steps_dir}: no step replays (<class>_<load>_<repeat>.csv.gz)")
    steps = pd.concat(frames, ignore_index=True)
    steps = steps[(steps["kind"] == "decode") & (steps["cuda_graph"] == 1)]
    return pd.DataFrame({"num_seqs": steps["num_seqs"], "context": steps["decode_context_tokens"] / steps["num_seqs"],
                         "seconds": steps["measured_execute_s"] - steps["predicted_execute_profiled_s"]})


def simulated_side(table: Path, profile: Path, model: str, hardware: str, num_blocks: int,
                   num_requests: int) -> pd.DataFrame:
    """Every decode step of every cell of the call simulated again: num_seqs, mean context, the
    decode programs' wait (s) the model adds to it."""
    base = base_config(model, hardware)
    cells = pd.read_csv(table)
    rows: list[tuple[int, float, float]] = []

    def recording(cost):
        programs = cost.decode_programs
        if programs is None:
            raise ValueError(f"{hardware}: no decode programs to price (backend.decode_programs, num_sms)")
        inner = programs.excess_s

        def excess(lens, seconds_per_token, graph=None):
            wait = inner(lens, seconds_per_token, graph)
            real = [n for n in lens if n > 0]
            rows.append((len(real), float(np.mean(real)), wait))
            return wait

        object.__setattr__(programs, "excess_s", excess)  # a frozen dataclass: this instance only
        return cost

    for (workload, load), part in cells.groupby(["workload", "load"], sort=False):
        rate = float(part["rate_req_s"].iloc[0]) if str(load) != "offline" else 0.0
        simulate_cell(profiled_cell(base, workload, str(load), rate, num_requests, profile, num_blocks), recording)
    return pd.DataFrame(rows, columns=["num_seqs", "context", "seconds"])


def by_bin(engine: pd.DataFrame, simulated: pd.DataFrame) -> pd.DataFrame:
    out = []
    for name, side in (("engine_residual", engine), ("model_wait", simulated)):
        binned = side.assign(bin=pd.cut(side["num_seqs"], BINS).astype(str))
        out.append(binned.groupby("bin", sort=False).agg(**{
            f"{name}_steps": ("seconds", "size"), f"{name}_ms": ("seconds", lambda s: 1e3 * s.median()),
            f"{name}_context": ("context", "median")}))
    order = [str(b) for b in pd.cut(pd.Series(BINS[1:]), BINS).cat.categories]
    return out[0].join(out[1], how="outer").reindex(order).dropna(how="all").round(4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=Path)
    parser.add_argument("table", type=Path)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--num-requests", type=int, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    table = by_bin(engine_side(args.steps), simulated_side(args.table, args.profile, args.model, args.hardware,
                                                           args.num_blocks, args.num_requests))
    print(table.to_string())
    if args.out is not None:
        table.to_csv(args.out, index_label="num_seqs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
