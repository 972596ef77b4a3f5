"""Decode throughput of a mixture-of-experts model at TP=N with each expert sliced over the ranks
(tp) against the same ranks holding whole experts (ep, ExecutionConfig.expert_parallel).

    python experiments/moe/ep_decode.py --preset qwen3-30b-a3b --out /tmp/ep   # on 2 GPUs

Per mode one engine (random weights, load_format=dummy), then per batch size B: B prompts of
--prompt-len random token ids, --output-len tokens each (greedy, ignore_eos), all admitted at once.
The decode rate of a batch is B over the median duration of its full-batch decode steps (the
engine's step records: device time of the step, the scheduler overlapped), so prefill and the
batch's ragged tail stay out of it. Rows go to decode.csv as each (mode, B) ends, so a run cut
short keeps what it measured; summary.md puts the two modes side by side.

Each mode runs in a process of its own: torch's symmetric memory is set up once per process, so a
second tensor-parallel engine in the same process falls back to NCCL for every all-reduce, and
the modes would differ in more than the experts' placement (experiments/moe/h200x2_ep_run1/).
decode.csv's all_reduce column says what each engine ran (BackendInfo.all_reduce).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from engine import LLM, SamplingParams
from engine.core.expert_parallel import check_expert_parallel
from engine.core.model_shapes import model_shape

MODES = ("tp", "ep")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen3-30b-a3b")
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, default=2, help="tensor_parallel_size of both modes")
    p.add_argument("--modes", default="tp,ep", help=f"comma-separated, of {MODES}")
    p.add_argument("--batches", default="1,8,32,128,256", help="decode batch sizes")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--append", action="store_true", help=argparse.SUPPRESS)  # one mode's process: keep decode.csv
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"--modes: {bad} not in {MODES}")
    try:
        args.batch_sizes = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches must be comma-separated ints, got {args.batches!r}")
    if min(args.batch_sizes) < 1 or args.prompt_len < 1 or args.output_len < 4 or args.tp < 1:
        p.error("--batches, --prompt-len, --tp must be >= 1 and --output-len >= 4")
    shape = model_shape(args.preset)  # one line for an unknown preset
    if "ep" in modes:
        check_expert_parallel(shape, args.tp, True)
    args.mode_list = modes
    return args


def decode_rate(llm: LLM, batch: int, prompt_len: int, output_len: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    vocab = min(llm.executor.info().vocab_size, 10_000)
    prompts = [rng.integers(0, vocab, prompt_len).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    assert llm.last_run is not None
    full = [r.duration_s for r in llm.last_run.steps
            if r.stats.kind == "decode" and r.stats.num_decode_tokens == batch]
    step_s = statistics.median(full) if full else float("nan")
    return {"batch": batch, "decode_steps": len(full), "median_step_ms": 1e3 * step_s,
            "decode_tok_s": batch / step_s if full else float("nan"), "generate_wall_s": wall}


def run_mode(args: argparse.Namespace, mode: str, csv: Path) -> None:
    t0 = time.perf_counter()
    llm = LLM(args.preset, load_format="dummy", device=args.device, tensor_parallel_size=args.tp,
              expert_parallel=mode == "ep", max_model_len=args.prompt_len + args.output_len + 16,
              max_num_seqs=max(args.batch_sizes), max_graph_batch_size=max(args.batch_sizes),
              prefill_graph_tokens=0, max_num_batched_tokens=max(8192, max(args.batch_sizes)))
    startup = time.perf_counter() - t0
    try:
        decode_rate(llm, 2, 16, 4, seed=99)  # warm-up
        for batch in tqdm(args.batch_sizes, desc=f"{mode} tp={args.tp}", unit="batch"):
            row = {"mode": mode, "tp": args.tp, "preset": args.preset, "startup_s": startup,
                   "prompt_len": args.prompt_len, "output_len": args.output_len,
                   "all_reduce": llm.executor.info().all_reduce or "none",
                   **decode_rate(llm, batch, args.prompt_len, args.output_len, seed=batch)}
            pd.DataFrame([row]).to_csv(csv, mode="a", header=not csv.exists(), index=False)
            print(f"{mode} B={batch}: {row['decode_tok_s']:.0f} tok/s ({row['median_step_ms']:.2f} ms/step)",
                  flush=True)
    finally:
        llm.shutdown()


def summarise(csv: Path, out: Path) -> None:
    df = pd.read_csv(csv)
    table = df.pivot_table(index="batch", columns="mode", values="decode_tok_s")
    if {"tp", "ep"} <= set(table.columns):
        table["ep/tp"] = table["ep"] / table["tp"]
    lines = [f"# {df.preset.iloc[0]} decode, TP={df.tp.iloc[0]}: experts sliced (tp) vs whole experts (ep)", "",
             "Output tok/s = batch / median full-batch decode step (experiments/moe/ep_decode.py).", "",
             "| batch | " + " | ".join(table.columns) + " |", "|---" * (len(table.columns) + 1) + "|"]
    lines += [f"| {b} | " + " | ".join(f"{v:.3g}" for v in row) + " |" for b, row in table.iterrows()]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def mode_command(args: argparse.Namespace, mode: str) -> list[str]:
    """This script for one mode, in a fresh process, appending to the same decode.csv."""
    return [sys.executable, str(Path(__file__).resolve()), "--preset", args.preset, "--out", args.out,
            "--tp", str(args.tp), "--modes", mode, "--batches", args.batches, "--prompt-len", str(args.prompt_len),
            "--output-len", str(args.output_len), "--device", args.device, "--append"]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "decode.csv"
    if not args.append:
        csv.unlink(missing_ok=True)
    if len(args.mode_list) == 1:
        run_mode(args, args.mode_list[0], csv)
        summarise(csv, out)
        return 0
    # the child imports this checkout's engine, wherever it is started from
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    failed = 0
    for mode in args.mode_list:
        code = subprocess.run(mode_command(args, mode), check=False, env=env).returncode
        if code:
            print(f"mode {mode}: exit {code}", file=sys.stderr, flush=True)
            failed = failed or code
    return failed


if __name__ == "__main__":
    sys.exit(main())
