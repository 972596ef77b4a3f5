"""bench.csv + steps.csv(.gz) (from bench_engine.py) -> bench.md: throughput table and step profile.

    python experiments/engine/summarize.py $OUT/bench
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from harness.scripting import read_steps, require

PHASES = ("prepare", "forward", "sample")


def _table(frame: pd.DataFrame) -> str:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in frame.iterrows():
        cells = [f"{v:,.3g}" if isinstance(v, float) and abs(v) < 10 else
                 f"{v:,.0f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile(steps: pd.DataFrame) -> pd.DataFrame:
    """Mean microseconds per step by kind: host time per phase, device time per phase, between steps."""
    rows = []
    for (preset, variant, kind), group in steps.groupby(["preset", "variant", "kind"], sort=False):
        row = {"preset": preset, "variant": variant, "kind": kind, "steps": len(group),
               "mean_batch": group.num_requests.mean(), "step_us": 1e6 * group.duration_s.mean(),
               "between_steps_us": 1e6 * group.gap_s.mean()}
        for side in ("host", "gpu"):
            for phase in PHASES:
                col = f"{side}_{phase}_s"
                if col in group:
                    row[f"{side}_{phase}_us"] = 1e6 * group[col].mean()
        row["total_s"] = group.duration_s.sum() + group.gap_s.sum()
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a bench_engine.py --out folder")
    out = parser.parse_args(argv).folder
    bench = pd.read_csv(require(out / "bench.csv"))
    steps = read_steps(out)
    head = bench.iloc[0]
    md = [f"# Engine bench ({head.device})", "",
          f"- date (UTC): {head.date_utc}", "- command(s): " + "; ".join(f"`{c}`" for c in bench.command.unique()),
          "- workload: nano-vllm's bench (256 requests, seed 0, prompt/output lengths uniform in [100, 1024], "
          "token ids < 10,000, temperature 0.6, ignore_eos, max_model_len 4096), after one warm-up generate",
          "- output tok/s = generated tokens / wall time of generate(); prefill and decode rates are tokens "
          "over the summed durations of the steps that did prefill / decode",
          "", "## Throughput", "",
          _table(bench[["preset", "variant", "attention_backend", "cuda_graphs",
                        *(["async_scheduling"] if "async_scheduling" in bench else []),
                        "num_kv_blocks", "output_tokens",
                        "wall_s", "output_tok_s", "prefill_tok_s", "decode_tok_s", "fraction_of_bound",
                        "startup_s"]]),
          "", "## Where a step's time goes (mean microseconds per step)", "",
          "host_* = Python wall time per phase (prepare: index arrays + upload; forward: eager launches or the "
          "graph replay call; sample: logits, sampler, wait for the ids), gpu_* = CUDA-event time over the same "
          "phases, between_steps = scheduler and loop (wall time between two steps; with async scheduling, "
          "the device's idle time before the next step, from CUDA events, and step_us is the step's span on "
          "the device).", "",
          _table(profile(steps))]
    (out / "bench.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
