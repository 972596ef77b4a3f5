"""Prefill steps as a disaggregated prefill replica runs them, under controlled conditions: one GPU
steps, a second receives its KV sends (experiments/disagg/h200x4_pd_mixes/run2/README.md, "The
prefill replicas under load", says what it is to decide).

    python -m experiments.disagg.prefill_probe --model qwen3-0.6b --out $OUT/probe      # two GPUs
    python -m experiments.disagg.prefill_probe --cpu --tokens 24,40 --repeats 2 --out /tmp/probe

Each shape, one prompt without cached context (--tokens; up to --graph-tokens they replay a prefill
graph, above it they run eager), is stepped --repeats times in each condition:

  back_to_back   submitted before the previous step's result is read (how the profile's grid runs)
  idle_sleep     after an idle gap of --gap-ms, the host blocked on a pipe (as a replica's loop waits)
  idle_spin      the same gap with the host spinning (its CPU kept awake)
  idle_parts     the idle_sleep gap, then the host work submit() does on an idle device before the
                 step's first device work, each part timed alone just before the step: anchor_s,
                 the device clock's anchor (engine.overlap.DeviceClock.set_anchor: an event recorded
                 and waited on; CUDA only), and build_s, building the batch (ModelRunner.build_batch)
  handover       the gap ends with a request-sized message from another process (the router's
                 hand-over); hop_s runs from its send to the step's submit()
  send_inflight  after the gap, a --send-tokens request's KV is gathered and sent to the peer
                 (engine.kv_link.BlockMover and KVLink: NCCL on GPUs, gloo on CPU) just before
                 the step, so the send is in flight during it
  send_before    the same send posted and completed in the gap, before the step

Per step (probe_steps.csv): duration_s (the device's span, as the engine measures served steps;
wall time on CPU), launch_s (the host time of submit()), gc_s (collections during the step),
hop_s, anchor_s and build_s. probe_summary.csv, per condition and shape: median and mean duration,
the share of steps over 1.4x the back-to-back median, median launch, hop, anchor and build.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import time
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.fidelity.loop_probe import GcTimer

CONDITIONS = ("back_to_back", "idle_sleep", "idle_spin", "idle_parts", "handover", "send_inflight", "send_before")
PEER_CONDITIONS = ("handover", "send_inflight", "send_before")  # need the second process
SLOW = 1.4


def _router(conn) -> None:
    """The hand-over's other process: told (gap_s, tokens), it waits and sends a prompt-sized message."""
    while (order := conn.recv()) is not None:
        gap, tokens = order
        time.sleep(gap)
        conn.send_bytes(pickle.dumps((time.perf_counter(), list(range(tokens)))))


def _peer(port: int, device: str, shape: tuple[int, ...], dtype: str, num_kv_heads: int, sends: int) -> None:
    """The receiving replica: posts `sends` receives of one request's blocks from rank 0, in order."""
    import torch

    from engine.core.disagg_wall import LinkSpec
    from engine.kv_link import KVLink

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    link = KVLink(LinkSpec(1, 2, port, 120.0), dev, num_kv_heads)
    link.warm_up(1)
    staging = torch.empty(shape, dtype=getattr(torch, dtype), device=dev)
    for _ in range(sends):
        link.recv(staging, 0).wait()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Probe:
    def __init__(self, args) -> None:
        import torch

        from engine.config import EngineConfig
        from engine.core.config import CacheConfig, ExecutionConfig, SchedulerConfig
        from engine.executor import EngineExecutor

        self.args, self.torch = args, torch
        device = "cpu" if args.cpu else "cuda"
        self.sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max(args.tokens),
                                     max_model_len=args.max_model_len)
        self.executor = EngineExecutor(
            EngineConfig(model=args.model, load_format="dummy", device=device, dtype="float32" if args.cpu else "auto",
                         execution=ExecutionConfig(prefill_graph_tokens=args.graph_tokens)),
            self.sched, CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks))
        self.gc = GcTimer()
        self.pipe = mp.Pipe()  # idle_sleep blocks on its first end; nothing is ever sent
        self.link = self.mover = self.peer = None
        self.router = None

    def start_children(self, sends: int) -> None:
        from engine.core.disagg_wall import LinkSpec
        from engine.kv_link import BlockMover, KVLink
        from engine.tp.group import free_port

        spawn = mp.get_context("spawn")
        mine, theirs = spawn.Pipe()
        self.router = (spawn.Process(target=_router, args=(theirs,), daemon=True), mine)
        self.router[0].start()
        cache = self.executor.runner.kv_cache
        blocks = -(-self.args.send_tokens // self.args.block_size)
        shape = (cache.shape[0], 2, blocks, *cache.shape[3:])
        port, device = free_port(), "cpu" if self.args.cpu else "cuda:1"
        dtype = str(cache.dtype).removeprefix("torch.")
        self.peer = spawn.Process(target=_peer, args=(port, device, shape, dtype, cache.shape[-2], sends), daemon=True)
        self.peer.start()
        self.link = KVLink(LinkSpec(0, 2, port, 120.0), cache.device, cache.shape[-2])
        self.link.warm_up(1)
        self.mover = BlockMover(cache.device)
        self.send_table = list(range(self.args.num_blocks - blocks, self.args.num_blocks))

    def send(self):
        blocks = self.mover.gather(self.executor.runner.kv_cache, self.send_table)
        return self.mover.send(self.link, blocks, 1), blocks

    def finish(self, move) -> None:
        """Wait on the host for a send (the Move and the copy it sends) to complete."""
        move[0].wait()
        if self.executor.device.type == "cuda":
            self.torch.cuda.synchronize()

    def step(self, plan) -> dict:
        collected = len(self.gc.rows)
        t = time.perf_counter()
        pending = self.executor.submit(plan)
        launch = time.perf_counter() - t
        duration = pending.result().duration_s
        return {"duration_s": duration, "launch_s": launch, "submit_at": t,
                "gc_s": sum(r["pause_s"] for r in self.gc.rows[collected:])}

    def host_parts(self, plan) -> dict:
        """The host work of submit() on an idle device before the step's first device work, timed
        part by part (the idle_parts condition)."""
        from engine.overlap import DeviceClock

        anchor = np.nan
        if self.executor.device.type == "cuda":
            started = time.perf_counter()
            DeviceClock().set_anchor()
            anchor = time.perf_counter() - started
        started = time.perf_counter()
        self.executor.runner.build_batch(plan)
        return {"anchor_s": anchor, "build_s": time.perf_counter() - started}

    def condition(self, name: str, plan, repeats: int) -> list[dict]:
        gap = self.args.gap_ms / 1e3
        rows = []
        if name == "back_to_back":
            pending = self.executor.submit(plan)
            for i in range(repeats):
                t_next = time.perf_counter()
                following = self.executor.submit(plan) if i + 1 < repeats else None
                launch = time.perf_counter() - t_next
                rows.append({"duration_s": pending.result().duration_s, "launch_s": launch if following else np.nan})
                pending = following
            return rows
        for _ in range(repeats):
            hop, move, parts = np.nan, None, {}
            if name == "idle_sleep":
                self.pipe[0].poll(gap)
            elif name == "idle_parts":
                self.pipe[0].poll(gap)
                parts = self.host_parts(plan)
            elif name == "idle_spin":
                end = time.perf_counter() + gap
                while time.perf_counter() < end:
                    pass
            elif name == "handover":
                self.router[1].send((gap, len(plan.scheduled[0].token_ids)))
                sent, _ = pickle.loads(self.router[1].recv_bytes())
                hop = time.perf_counter() - sent
            elif name == "send_inflight":
                self.pipe[0].poll(gap)
                move = self.send()
            else:  # send_before
                started = time.perf_counter()
                self.finish(self.send())
                self.pipe[0].poll(max(0.0, gap - (time.perf_counter() - started)))
            row = self.step(plan)
            if move is not None:  # done before the next gap, and before its copy is freed
                self.finish(move)
            rows.append({**row, "hop_s": hop, **parts})
        return rows

    def run(self) -> pd.DataFrame:
        from harness.scripting import probe_plan

        args = self.args
        sends = 2 * args.repeats * len(args.tokens) if args.peer else 0
        conditions = [c for c in CONDITIONS if args.peer or c not in PEER_CONDITIONS]
        if args.peer:
            self.start_children(sends)
        out = []
        with self.gc:
            for tokens in args.tokens:
                plan = probe_plan(self.executor, self.sched, [(tokens, 0, False)])
                if plan is None:
                    raise ValueError(f"--tokens {tokens}: the probe's cache ({args.num_blocks} blocks) cannot hold it")
                for _ in range(2):  # warm-up: graphs, allocator, the kernels' first launches
                    self.executor.execute(plan)
                for name in conditions:
                    for i, row in enumerate(self.condition(name, plan, args.repeats)):
                        regime = "graph" if tokens <= args.graph_tokens else "eager"
                        out.append({"condition": name, "tokens": tokens, "regime": regime, "repeat": i, **row})
        if args.peer:
            self.router[1].send(None)
            self.peer.join(120)
            self.router[0].join(10)
        return pd.DataFrame(out).drop(columns="submit_at", errors="ignore")


def summarize(steps: pd.DataFrame) -> pd.DataFrame:
    base = steps[steps["condition"] == "back_to_back"].groupby("tokens")["duration_s"].median()
    steps = steps.assign(slow=steps["duration_s"] > SLOW * steps["tokens"].map(base))
    for column in ("hop_s", "anchor_s", "build_s"):  # only some conditions time them
        if column not in steps:
            steps[column] = np.nan
    table = steps.groupby(["tokens", "regime", "condition"], sort=False).agg(
        steps=("duration_s", "size"), median_ms=("duration_s", "median"), mean_ms=("duration_s", "mean"),
        slow_share=("slow", "mean"), launch_ms=("launch_s", "median"), hop_ms=("hop_s", "median"),
        anchor_ms=("anchor_s", "median"), build_ms=("build_s", "median"), gc_ms=("gc_s", "sum"))
    for column in ("median_ms", "mean_ms", "launch_ms", "hop_ms", "anchor_ms", "build_ms", "gc_ms"):
        table[column] *= 1e3
    return table.reset_index()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model preset (random weights; default qwen3-0.6b, "
                        "tiny-qwen3 with --cpu)")
    parser.add_argument("--cpu", action="store_true", help="the tiny model on CPU, gloo for the sends (a test run)")
    parser.add_argument("--tokens", default="1024,3072,4608,5632", help="prompt lengths, comma-separated")
    parser.add_argument("--graph-tokens", type=int, default=None, help="prefill graphs up to this (default 4096; "
                        "0 with --cpu)")
    parser.add_argument("--send-tokens", type=int, default=None,
                        help="the sent request's prompt length (default 5120; the longest --tokens with --cpu)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--gap-ms", type=float, default=30.0, help="the idle gap before a step")
    parser.add_argument("--no-peer", dest="peer", action="store_false",
                        help="skip the conditions that need a second process (handover, sends)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.model = args.model or ("tiny-qwen3" if args.cpu else "qwen3-0.6b")
    args.graph_tokens = args.graph_tokens if args.graph_tokens is not None else (0 if args.cpu else 4096)
    args.send_tokens = args.send_tokens or (max(args.tokens) if args.cpu else 5120)
    args.block_size = 16 if args.cpu else 256
    args.max_model_len = max(max(args.tokens), args.send_tokens) + args.block_size
    need = -(-args.max_model_len // args.block_size)
    args.num_blocks = 2 * need + 2
    if min(args.tokens) < 1 or args.repeats < 1 or args.gap_ms < 0:
        parser.error("--tokens, --repeats must be >= 1 and --gap-ms >= 0")
    args.out.mkdir(parents=True, exist_ok=True)
    probe = Probe(args)
    try:
        steps = probe.run()
    finally:
        probe.executor.shutdown()
    table = summarize(steps)
    steps.to_csv(args.out / "probe_steps.csv", index=False, float_format="%.6g")
    table.to_csv(args.out / "probe_summary.csv", index=False, float_format="%.4g")
    print(table.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
