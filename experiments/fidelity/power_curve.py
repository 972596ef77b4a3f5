"""A power curve (sim.power_limit) from prefill-rate probe summaries (prefill_rate_probe.py).

Takes each named shape's mixes in each summary (one series: a shape on one machine): their prefill
tokens a second, the prefill step's span over the series' lightest mix's, and the decode steps'
span over the lightest mix's (a mix of prefill alone has none: it keeps the decode factor of the
mix before; a factor under 1 is timing noise, taken as 1). The series are pooled by rate and each
factor made non-decreasing in it (pooled adjacent violators: where a faster mix ran quicker than a
slower one, both take their mean), so the curve is the series' middle where they disagree; a point
at no prefill, 1.0 for both, starts it. The shapes to take are those that reach the GPU's power
limit with the device bound (the probe's README says which did; an eager prefill whose launches
outlast its device work times the host). The curve records the GPU's die and power limit from its
conf/hardware entry, so that it prices every GPU of that die and limit (sim.power_limit).

    python -m experiments.fidelity.power_curve experiments/fidelity/prefill_rate_h200/summary.csv \\
        experiments/fidelity/prefill_rate_h200_shapes/summary.csv \\
        --shape "eager prefill 6 x 2560" "prefill 6 x 2560" "prefill 12 x 1280" --model qwen3-0.6b \\
        --hardware H200-SXM-141GB --out profiles/h200/qwen3-0.6b.power.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import pandas as pd

from harness.config import load_hardware
from harness.convert import ConfigError
from harness.profiles import hardware_conf_name
from sim.power_limit import CURVE_FIELDS, GPU_FIELDS, PowerCurve

WINDOW_S = 1.0  # experiments/fidelity/cause/prefill_load.py's window, over which served steps followed the rate


def series_of(summary: pd.DataFrame, shape: str) -> pd.DataFrame:
    """rate (tokens/s), prefill and decode factors of one shape's mixes in one summary, lightest
    first (module docstring); ValueError without them."""
    rows = summary[summary["shape"] == shape].sort_values("prefill_k_tokens_per_s")
    if rows.empty:
        raise ValueError(f"no mixes of shape {shape!r} (shapes: {sorted(summary['shape'].unique())})")
    # a busier mix is no faster than the lightest: a factor under 1 is the timing's noise
    prefill = rows["prefill_span_ms"] / rows["prefill_span_ms"].iloc[0]
    decode = (rows["decode_span_ms"] / rows["decode_span_ms"].iloc[0]).ffill()
    return pd.DataFrame({"rate": rows["prefill_k_tokens_per_s"].to_numpy() * 1e3,
                         "prefill": prefill.clip(lower=1.0).to_numpy(), "decode": decode.clip(lower=1.0).to_numpy()})


def non_decreasing(values: list[float]) -> list[float]:
    """values made non-decreasing by pooling adjacent violators (each block its mean)."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled block
    for value in values:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def gpu_of(hardware: str) -> tuple[str | None, float | None]:
    """(die, power limit in W) of the conf/hardware entry named hardware; ValueError where none is."""
    conf = hardware_conf_name(hardware)
    if conf is None:
        raise ValueError(f"--hardware {hardware}: no conf/hardware entry has that name")
    spec = load_hardware(conf, "--hardware")
    return spec.chip, spec.power_limit_w


def curve_of(summaries: list[pd.DataFrame], shapes: list[str], model: str, hardware: str, window_s: float,
             command: str, gpu: tuple[str | None, float | None] = (None, None)) -> PowerCurve:
    """The curve of the named shapes' series in the summaries, pooled (module docstring), with the
    GPU's die and power limit; ValueError where a shape is in none of them."""
    series = []
    for shape in shapes:
        found = [series_of(summary, shape) for summary in summaries if (summary["shape"] == shape).any()]
        if not found:
            raise ValueError(f"no mixes of shape {shape!r} in any summary")
        series += found
    pooled = pd.concat(series).sort_values("rate", kind="stable")
    rates = [0.0, *pooled["rate"].round(0)]
    if len(set(rates)) < len(rates):
        raise ValueError("two mixes of the series have the same prefill rate: give one of them")
    prefill, decode = (tuple(round(x, 4) for x in non_decreasing([1.0, *pooled[k]])) for k in ("prefill", "decode"))
    return PowerCurve(hardware, model, window_s, tuple(rates), prefill, decode, command, *gpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", type=Path, nargs="+", help="prefill_rate_probe.py's summary.csv files")
    parser.add_argument("--shape", nargs="+", required=True, help="the shapes whose mixes make the curve")
    parser.add_argument("--model", required=True, help="the ModelSpec name the probe served (e.g. qwen3-0.6b)")
    parser.add_argument("--hardware", required=True, help="the HardwareSpec name of the GPU (e.g. H200-SXM-141GB)")
    parser.add_argument("--window-s", type=float, default=WINDOW_S, help="seconds of recent steps the rate is over")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        summaries = [pd.read_csv(path) for path in args.summaries]
        command = "python -m experiments.fidelity.power_curve " + shlex.join(sys.argv[1:] if argv is None else argv)
        gpu = gpu_of(args.hardware)
        curve = curve_of(summaries, args.shape, args.model, args.hardware, args.window_s, command, gpu)
    except (OSError, KeyError, ValueError, ConfigError, pd.errors.ParserError) as error:
        print(f"power_curve: {error}", file=sys.stderr)
        return 1
    data = {k: getattr(curve, k) for k in (*CURVE_FIELDS, *GPU_FIELDS)}
    data.update({k: list(data[k]) for k in CURVE_FIELDS[3:6]})
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.out}: {len(curve.prefill_tokens_per_s)} points up to {curve.prefill_tokens_per_s[-1]:.0f} tokens/s, "
          f"prefill x{curve.prefill_scale[-1]:.3f}, decode x{curve.decode_scale[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
