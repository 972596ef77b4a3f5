"""Which tensor-parallel all-reduces run as one-shot launches: the one rule of both backends.

ExecutionConfig.all_reduce names the implementation. "nccl": every all-reduce on NCCL's ring;
"symmetric": tensors of at most ONE_SHOT_MAX_BYTES through the engine's one-shot kernel over
symmetric memory (engine.tp.symmetric), larger ones on NCCL; "auto": "symmetric" where the GPUs
can map each other's memory, else "nccl". The engine launches by this rule and the simulator
prices by it (sim.roofline), with the hardware's one-shot figures.
"""

from __future__ import annotations

ALL_REDUCES = ("auto", "nccl", "symmetric")
# 4 MiB: a bf16 [512, 4096] activation (the largest decode graph of Qwen3-8B). On 2 x H200 NCCL
# overtakes a one-shot all-reduce near 8 MiB (experiments/tp/h200x2_async/all_reduce.csv).
ONE_SHOT_MAX_BYTES = 4 << 20


def one_shot_max_tokens(hidden_size: int, dtype_bytes: int) -> int:
    """Where all_reduce is not "nccl", steps of at most this many tokens sum their [tokens, hidden]
    activations in one-shot launches."""
    return ONE_SHOT_MAX_BYTES // (hidden_size * dtype_bytes)


def priced_all_reduce(mode: str, tensor_parallel_size: int, one_shot_measured: bool) -> str:
    """What a simulated device runs for `mode`: "" on one rank (nothing to sum), "symmetric" where
    the one-shot kernel would run and its hardware figures are known, else "nccl". "symmetric" on
    hardware without those figures is the caller's error to raise."""
    if tensor_parallel_size <= 1:
        return ""
    return "symmetric" if mode != "nccl" and one_shot_measured else "nccl"
