"""A power curve (sim.power_limit) from the prefill-rate probe's summary (prefill_rate_probe.py).

Takes one shape's mixes, lightest first: their prefill tokens a second, the prefill step's span
over the lightest mix's, and the decode steps' span over the lightest mix's (a mix of prefill
alone has none: it keeps the decode factor of the mix before). A point at no prefill, 1.0 for both,
starts the curve. The shape to take is one that reaches the GPU's power limit (the probe's README
says which did).

    python -m experiments.fidelity.power_curve experiments/fidelity/prefill_rate_h200/summary.csv \\
        --shape "eager prefill 6 x 2560" --model qwen3-0.6b --hardware H200-SXM-141GB \\
        --out profiles/h200/qwen3-0.6b.power.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import pandas as pd

from sim.power_limit import PowerCurve

WINDOW_S = 1.0  # experiments/fidelity/cause/prefill_load.py's window, over which served steps followed the rate


def curve_of(summary: pd.DataFrame, shape: str, model: str, hardware: str, window_s: float,
             command: str) -> PowerCurve:
    """The curve of summary's rows of this shape (module docstring); ValueError without them."""
    rows = summary[summary["shape"] == shape].sort_values("prefill_k_tokens_per_s")
    if rows.empty:
        raise ValueError(f"no mixes of shape {shape!r} (shapes: {sorted(summary['shape'].unique())})")
    prefill = rows["prefill_span_ms"] / rows["prefill_span_ms"].iloc[0]
    decode = (rows["decode_span_ms"] / rows["decode_span_ms"].iloc[0]).ffill()
    rates = [0.0, *(rows["prefill_k_tokens_per_s"] * 1e3).round(0)]
    return PowerCurve(hardware, model, window_s, tuple(rates), (1.0, *prefill.round(4)), (1.0, *decode.round(4)),
                      command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path, help="prefill_rate_probe.py's summary.csv")
    parser.add_argument("--shape", required=True, help="the shape whose mixes make the curve")
    parser.add_argument("--model", required=True, help="the ModelSpec name the probe served (e.g. qwen3-0.6b)")
    parser.add_argument("--hardware", required=True, help="the HardwareSpec name of the GPU (e.g. H200-SXM-141GB)")
    parser.add_argument("--window-s", type=float, default=WINDOW_S, help="seconds of recent steps the rate is over")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        summary = pd.read_csv(args.summary)
        command = "python -m experiments.fidelity.power_curve " + shlex.join(sys.argv[1:] if argv is None else argv)
        curve = curve_of(summary, args.shape, args.model, args.hardware, args.window_s, command)
    except (OSError, KeyError, ValueError, pd.errors.ParserError) as error:
        print(f"power_curve: {error}", file=sys.stderr)
        return 1
    data = {"hardware": curve.hardware, "model": curve.model, "window_s": curve.window_s,
            "prefill_tokens_per_s": list(curve.prefill_tokens_per_s), "prefill_scale": list(curve.prefill_scale),
            "decode_scale": list(curve.decode_scale), "command": curve.command}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.out}: {len(curve.prefill_tokens_per_s)} points up to {curve.prefill_tokens_per_s[-1]:.0f} tokens/s, "
          f"prefill x{curve.prefill_scale[-1]:.3f}, decode x{curve.decode_scale[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
