"""How much longer does a prefill step take the more prefill the GPU has been running?

Served code_completion runs' prefill steps cost more the more prefill tokens the run computed in
the second before them (cause/prefill_load.py: 1.00-1.03x their price under 150 k tokens a second,
1.05-1.07x at 300-400 k, on two H200s). This measures it apart from any served cell: Qwen3-0.6B
steps on one GPU, a mix of one prefill shape and a decode shape repeated back to back, each step
submitted before the previous one's result is read, for --seconds per mix; the fewer decode steps
between prefills, the higher the prefill rate. Per mix: the prefill steps' median device span in the
mix's second half (the clock settled), the prefill tokens a second over that half, and the SM clock
and power nvidia-smi sampled then (experiments/fidelity/sustained_probe.py's sampler).

    python experiments/fidelity/prefill_rate_probe.py --model qwen3-0.6b --out $OUT/prefill_rate
    python experiments/fidelity/prefill_rate_probe.py --model qwen3-0.6b --prefills 1x2048 3x2000 12x1280 --out ...

--prefills: other prefill shapes, each PROMPTSxTOKENS (a step of that many fresh prompts of that
many tokens; a CUDA graph where the engine captured one that size, eager otherwise).

Writes steps.csv (every step: shape, mix, time, span), clocks.csv and summary.csv / summary.txt.
"""

from __future__ import annotations

import subprocess
import time

import pandas as pd

from experiments.fidelity.sustained_probe import CLOCK_FIELDS, read_clocks
from harness.scripting import open_probe_engine, probe_args, probe_parser, probe_plan

PREFILLS = {  # name -> entries (new tokens, cached tokens, is_decode)
    "graph prefill 3072": [(3072, 0, False)],
    "eager prefill 6 x 2560": [(2560, 0, False)] * 6,
}
DECODE = [(1, 2000, True)] * 8  # the class's decode steps: a few sequences of about 2k tokens
DECODES_PER_PREFILL = (0, 1, 2, 4, 8, 16, 40)  # the mixes, from all prefill to mostly decode


def prefill_shapes(specs: list[str] | None) -> dict[str, list[tuple[int, int, bool]]]:
    """PREFILLS, or the shapes PROMPTSxTOKENS specs name; ValueError naming a spec that is not one."""
    if not specs:
        return PREFILLS
    shapes = {}
    for spec in specs:
        prompts, _, tokens = spec.lower().partition("x")
        if not (prompts.isdigit() and tokens.isdigit() and int(prompts) > 0 and int(tokens) > 0):
            raise ValueError(f"--prefills: {spec!r} is not PROMPTSxTOKENS (e.g. 3x2000)")
        shapes[f"prefill {int(prompts)} x {int(tokens)}"] = [(int(tokens), 0, False)] * int(prompts)
    return shapes


def run_mix(executor, prefill, decode, decodes: int, seconds: float, start: float) -> list[dict]:
    """One prefill then `decodes` decode steps, over and over for `seconds`: each step's span."""
    cycle = [("prefill", prefill)] + [("decode", decode)] * decodes
    rows, i = [], 0
    stop = time.perf_counter() + seconds
    kind, plan = cycle[0]
    pending = executor.submit(plan)
    while True:
        more = time.perf_counter() < stop
        i += 1
        following = executor.submit(cycle[i % len(cycle)][1]) if more else None
        span = pending.result().duration_s
        rows.append({"kind": kind, "t_s": time.perf_counter() - start, "span_s": span,
                     "prefill_tokens": plan.stats.num_prefill_tokens})
        if not more:
            return rows
        kind, plan = cycle[i % len(cycle)]
        pending = following


def summarize(steps: pd.DataFrame, clocks: pd.DataFrame) -> pd.DataFrame:
    """Per shape and mix, the second half of its steps: prefill rate, median prefill span, clock."""
    out = []
    for (shape, decodes), group in steps.groupby(["shape", "decodes"], sort=False):
        half = group[group.t_s >= group.t_s.min() + (group.t_s.max() - group.t_s.min()) / 2]
        elapsed = half.t_s.max() - half.t_s.min()
        window = clocks[(clocks.t_s >= half.t_s.min()) & (clocks.t_s <= half.t_s.max())]
        prefill = half[half.kind == "prefill"]
        out.append({"shape": shape, "decodes_per_prefill": decodes,
                    "prefill_k_tokens_per_s": prefill.prefill_tokens.sum() / max(elapsed, 1e-9) / 1e3,
                    "prefill_span_ms": 1e3 * prefill.span_s.median(),
                    "decode_span_ms": 1e3 * half[half.kind == "decode"].span_s.median(),
                    "sm_mhz": window.sm_mhz.median(), "power_w": window.power_w.median()})
    table = pd.DataFrame(out)
    # each shape's span at its lightest prefill rate: what the grid's bursts come closest to
    lightest = table.loc[table.groupby("shape")["prefill_k_tokens_per_s"].idxmin(), ["shape", "prefill_span_ms"]]
    base = table["shape"].map(lightest.set_index("shape")["prefill_span_ms"])
    return table.assign(span_over_lightest=table["prefill_span_ms"] / base)


def main(argv: list[str] | None = None) -> None:
    parser = probe_parser(__doc__.splitlines()[0], num_blocks=1000)
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds a mix runs")
    parser.add_argument("--prefills", nargs="+", default=None,
                        help="prefill shapes PROMPTSxTOKENS (default: the two of PREFILLS)")
    args = probe_args(parser, argv)
    try:
        shapes = prefill_shapes(args.prefills)
    except ValueError as error:
        raise SystemExit(f"prefill_rate_probe: {error}") from None
    executor, sched = open_probe_engine(args.ckpt, args.num_blocks, max_model_len=max(args.max_model_len, 8192))
    raw_clocks = args.out / "nvidia_smi.csv"
    with open(raw_clocks, "w") as sink:
        sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={CLOCK_FIELDS}", "--format=csv,noheader",
                                    "-lms", "100"], stdout=sink)
    start, start_wall = time.perf_counter(), (pd.Timestamp.now() - pd.Timestamp(0)).total_seconds()
    rows = []
    try:
        decode = probe_plan(executor, sched, DECODE, seed=1)
        for name, entries in shapes.items():
            prefill = probe_plan(executor, sched, entries)
            for decodes in sorted(DECODES_PER_PREFILL, reverse=True):  # lightest first: the clock rises from idle
                rows += [dict(shape=name, decodes=decodes, **row)
                         for row in run_mix(executor, prefill, decode, decodes, args.seconds, start)]
            time.sleep(2.0)
    finally:
        sampler.terminate()
        executor.shutdown()
    steps = pd.DataFrame(rows)
    clocks = read_clocks(raw_clocks, start_wall)
    steps.to_csv(args.out / "steps.csv", index=False)
    clocks.to_csv(args.out / "clocks.csv", index=False)
    table = summarize(steps, clocks)
    table.round(4).to_csv(args.out / "summary.csv", index=False)
    text = table.round(3).to_string(index=False) + "\n"
    (args.out / "summary.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
