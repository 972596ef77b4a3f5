"""Carry a profiled model (model.csv) fitted on one GPU to another by their datasheet ratios
(sim.transfer; the rule is in that module's docstring). No GPU needed.

    python experiments/fidelity/transfer_model.py profiles/h100/qwen3-0.6b.csv \
        --model qwen3-0.6b --source h100 --target h200 --out qwen3-0.6b_h200_from_h100.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.scripting import compose_run_config, one_line_errors
from sim.profiled import ProfiledCostModel
from sim.transfer import transfer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="a profiled model's coefficients (model.csv)")
    parser.add_argument("--model", required=True, help="conf/model name of the model the profile timed")
    parser.add_argument("--tp-size", type=int, default=1, help="the tensor-parallel size the profile ran at")
    parser.add_argument("--source", required=True, help="conf/hardware name the model was fitted on")
    parser.add_argument("--target", required=True, help="conf/hardware name to carry it to")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    def run() -> int:
        source_rc = compose_run_config([f"hardware={args.source}", f"model={args.model}"])
        target = compose_run_config([f"hardware={args.target}"]).hardware
        carried = transfer(ProfiledCostModel.load(args.profile), source_rc.hardware, target, source_rc.model,
                           args.tp_size)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        carried.to_csv(args.out)
        print(f"{args.profile} ({source_rc.hardware.name}) -> {args.out} ({target.name})")
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
