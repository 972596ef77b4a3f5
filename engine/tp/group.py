"""One process's membership in the tensor-parallel group, and the collectives the model uses.

NOTE: torch.distributed keeps its default process group in process-global state; DistGroup is
the one place that touches it, and refuses to start while another group is live in the same
process (one tensor-parallel engine per process at a time; a new one may start after shutdown).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket

import torch
import torch.distributed as dist

# NVLink multicast (NVLS) can take a shared host's GPUs out of service: keep it off in NCCL,
# PyTorch's symmetric memory and NVSHMEM, in this process and in every worker it spawns.
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
log = logging.getLogger(__name__)


def apply_safe_env() -> None:
    os.environ.update(SAFE_NCCL_ENV)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it: no hard-coded port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class DistGroup:
    """all_reduce_mode (ExecutionConfig.all_reduce, engine.core.collectives): "nccl";
    "symmetric", the one-shot kernel of engine.tp.symmetric for small tensors (an error where it
    cannot run); "auto", that kernel where it runs and agrees with NCCL on every rank, else NCCL."""

    def __init__(self, rank: int, size: int, port: int, device: torch.device, timeout_s: float,
                 all_reduce_mode: str = "nccl") -> None:
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group is already live in this process: "
                               "shut the other tensor-parallel engine down first")
        if all_reduce_mode == "symmetric" and device.type != "cuda":
            raise ValueError(f"all_reduce='symmetric' needs CUDA devices, got {device.type}")
        apply_safe_env()
        self.rank, self.size, self.device, self.port = rank, size, device, port
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL binds each rank's communicator to the current device
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            self.symmetric = self._symmetric(all_reduce_mode) if device.type == "cuda" and size > 1 else None
        except RuntimeError:
            self.destroy()  # the next engine in this process may start a group of its own
            raise

    def _symmetric(self, mode: str):
        if mode == "nccl":
            return None
        from engine.tp.symmetric import SymmetricAllReduce

        allocated, reducer, reason = None, None, ""
        try:
            allocated = SymmetricAllReduce.allocate(self.rank, self.size, self.device, self.port)
        except RuntimeError as error:
            reason = str(error)
        # every rank must take the same path, or a rendezvous or a step's collectives would never meet
        if self._everywhere(allocated is not None):
            try:
                reducer = SymmetricAllReduce.connect(self.rank, self.size, allocated)
            except RuntimeError as error:
                reason = str(error)
        if self._everywhere(reducer is not None):
            return reducer
        if mode == "symmetric":
            why = reason or "another rank failed"
            raise RuntimeError(f"all_reduce='symmetric' cannot run on rank {self.rank}: {why}")
        log.warning("one-shot all-reduce off, NCCL for every size: %s", reason or "another rank could not set it up")
        return None

    def _everywhere(self, ok: bool) -> bool:
        flag = torch.tensor([int(ok)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (callers hand in a fresh tensor). Every rank sees the same
        shapes, so every rank picks the same path."""
        if self.symmetric is not None and self.symmetric.applies(x):
            return self.symmetric(x)
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenation over ranks, in rank order, along the last dim."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x into every rank's x, in place. On NCCL the copy is queued on the device
        behind the work before it: the host does not wait (gloo on CPU computes it at once)."""
        dist.broadcast(x, src=0)
        return x

    def destroy(self) -> None:
        """Leave the group. NCCL communicators are aborted rather than finalized: finalizing waits
        for every rank to finalize, and on 2 x H200 rank 0 waited there until its worker was
        terminated, 30 s a shutdown (experiments/tp/shutdown_probe.py). An engine that stops has
        nothing left to agree on with its peers."""
        if not dist.is_initialized():
            return
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if self.device.type == "cuda" and abort is not None:
            abort()
        else:
            dist.destroy_process_group()
