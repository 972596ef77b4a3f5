"""Where does a decode step of few long sequences spend the time its context adds?

The profiling grid's decode graph rows of one sequence rise about 1.4e-7 s a context token on an
H200 (Qwen3-0.6B), five times the fit's one price for every batch (2.6e-8), and served steps of up
to 32 sequences run 80-90 us over their price (experiments/fidelity/code_completion_h200_r5). A
fluid of the split-KV kernel's programs does not say why: with one sequence the graph's 64 splits
cut 8 KV heads into 512 programs of a 64th of the context each. This times decode steps of B
sequences of L tokens each (CUDA graphs, submitted back to back) and, for the smallest and largest
B at the shortest and longest L, the kernels under torch.profiler: which kernel grows with L.

    python experiments/fidelity/small_batch_decode_probe.py --model qwen3-0.6b --max-model-len 8192 \\
        --out $OUT/small_decode

Writes steps.csv (B, L, median span), kernels.csv (B, L, kernel, device us a step) and summary.txt.
With --fit STEPS_CSV (no GPU) it fits the steps as a price per batch size + a price per context
token + a price per split the longest sequence's partials take to merge (sim.decode_programs
used_splits: the kernel's last program of a sequence merges them one after another) and prints each
step's fit:

    python experiments/fidelity/small_batch_decode_probe.py --fit experiments/fidelity/small_batch_decode_h200/steps.csv
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from harness.scripting import open_probe_engine, probe_args, probe_parser, probe_plan
from sim.decode_programs import DecodePrograms

BATCHES = (1, 2, 4, 8, 32)
CONTEXTS = (512, 2048, 4096, 8000)
REPEATS = 60


def time_step(executor, plan, repeats: int = REPEATS) -> float:
    """Median device span of plan repeated back to back (each submitted before the last is read)."""
    pending, spans = executor.submit(plan), []
    for _ in range(repeats):
        following = executor.submit(plan)
        spans.append(pending.result().duration_s)
        pending = following
    pending.result()
    return float(np.median(spans[repeats // 4:]))


def kernel_times(executor, plan, repeats: int = 20) -> pd.DataFrame:
    """Each kernel's device microseconds a step, over repeats of plan under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    time_step(executor, plan, 5)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        time_step(executor, plan, repeats)
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:80], "us_per_step": e.device_time_total / (repeats + 1)}
            for e in prof.key_averages() if e.device_time_total > 0]
    return pd.DataFrame(rows).sort_values("us_per_step", ascending=False)


def slopes(steps: pd.DataFrame) -> pd.DataFrame:
    """Per batch, the span's rise per context token of the whole batch (a least-squares line in L)."""
    out = []
    for batch, group in steps.groupby("batch"):
        slope = np.polyfit(group["context"] * batch, group["span_s"], 1)[0]
        out.append({"batch": batch, "s_per_context_token": slope, "span_at_shortest_ms": 1e3 * group["span_s"].min()})
    return pd.DataFrame(out)


# Qwen3-0.6B's decode kernel on an H200: 8 KV heads, 28 layers, 2 x 128 x 2 bytes a key, 132 SMs
QWEN3_06B_H200 = DecodePrograms(8, 28, 512, 132, 12.9e9)


def merge_fit(steps: pd.DataFrame, programs: DecodePrograms = QWEN3_06B_H200, graph_context: int = 8192,
              with_merge: bool = True) -> tuple[pd.DataFrame, float, float]:
    """(steps with their merge splits and fitted span, seconds per merged split of a step, seconds
    per context token): span = a price per batch size + c x the longest sequence's merge splits
    (0 where it takes one program) + d x the batch's context tokens, least squares. Each step a
    CUDA graph of its batch size captured for graph_context tokens (the probe's max_model_len).
    with_merge False: without c (as a profile's fit prices a decode graph step), c reported 0."""
    used = [int(programs.used_splits([c] * b, (b, graph_context)).max())
            for b, c in zip(steps["batch"], steps["context"])]
    merge = np.where(np.array(used) > 1, used, 0) * int(with_merge)
    batches = sorted(steps["batch"].unique())
    design = np.column_stack([(steps["batch"] == b).to_numpy(float) for b in batches]
                             + [merge, (steps["batch"] * steps["context"]).to_numpy(float)])
    if not with_merge:
        design[:, -2] = 0.0  # lstsq gives a zero column no weight
    coefs, *_ = np.linalg.lstsq(design, steps["span_s"].to_numpy(), rcond=None)
    fitted = steps.assign(merge_splits=merge, fit_s=design @ coefs)
    return fitted.assign(err=fitted["fit_s"] / fitted["span_s"] - 1), float(coefs[-2]), float(coefs[-1])


def print_fit(path: str) -> int:
    fitted, per_split, per_token = merge_fit(pd.read_csv(path))
    print(fitted.assign(span_ms=1e3 * fitted.span_s, fit_ms=1e3 * fitted.fit_s).drop(columns=["span_s", "fit_s"])
          .round(4).to_string(index=False))
    print(f"per merged split {1e6 * per_split:.2f} us a step ({1e6 * per_split / QWEN3_06B_H200.num_layers:.3f} "
          f"us a layer); per context token {per_token:.3e} s; largest |err| {fitted.err.abs().max():.1%}")
    plain, _, plain_token = merge_fit(pd.read_csv(path), with_merge=False)
    print(f"without the merge: per context token {plain_token:.3e} s; largest |err| {plain.err.abs().max():.1%} "
          f"({plain.loc[plain.err.abs().idxmax(), ['batch', 'context']].tolist()})")
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--fit"] and len(argv) == 2:
        sys.exit(print_fit(argv[1]))
    parser = probe_parser(__doc__.splitlines()[0], num_blocks=1200)
    args = probe_args(parser, argv)
    executor, sched = open_probe_engine(args.ckpt, args.num_blocks, max_model_len=args.max_model_len)
    steps, kernels = [], []
    try:
        for batch in BATCHES:
            for context in CONTEXTS:
                plan = probe_plan(executor, sched, [(1, context - 1, True)] * batch, seed=batch)
                steps.append({"batch": batch, "context": context, "span_s": time_step(executor, plan)})
                if batch in (BATCHES[0], BATCHES[-1]) and context in (CONTEXTS[0], CONTEXTS[-1]):
                    kernels.append(kernel_times(executor, plan).assign(batch=batch, context=context))
    finally:
        executor.shutdown()
    table, by_kernel = pd.DataFrame(steps), pd.concat(kernels)
    table.to_csv(args.out / "steps.csv", index=False)
    by_kernel.round(2).to_csv(args.out / "kernels.csv", index=False)
    wide = by_kernel.pivot_table(index="kernel", columns=["batch", "context"], values="us_per_step").round(1)
    text = "\n\n".join([table.assign(span_ms=1e3 * table.span_s).drop(columns="span_s").round(3).to_string(index=False),
                        slopes(table).to_string(index=False), wide.sort_values(wide.columns[-1], ascending=False)
                        .head(25).to_string()]) + "\n"
    (args.out / "summary.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
