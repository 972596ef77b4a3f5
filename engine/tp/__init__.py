"""Tensor parallelism across the GPUs of one host: rank 0 runs in the caller's process, ranks
1..size-1 in spawned worker processes driven over pipes; collectives go through torch.distributed
(NCCL on CUDA, gloo on CPU)."""

from engine.tp.group import SAFE_NCCL_ENV, DistGroup, free_port
from engine.tp.workers import Workers

__all__ = ["SAFE_NCCL_ENV", "DistGroup", "Workers", "free_port"]
