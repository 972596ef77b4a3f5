"""The one-shot all-reduce of kernels.all_reduce, on buffers from PyTorch symmetric memory.

SymmetricAllReduce.allocate takes, on each rank of the live process group, a data buffer (two
parities x one slot per rank) and a flag array from torch.distributed._symmetric_memory;
connect, once every rank has them (engine.tp.group.DistGroup agrees on that first, so that no
rank waits in a rendezvous another rank never joins), maps every rank's buffers and checks the
kernel against NCCL on probe tensors before it is trusted. Tensors up to ONE_SHOT_MAX_BYTES
(engine.core.collectives: decode steps and small prefills, where NCCL's fixed cost dominates)
take the one-shot kernel; larger ones, where NCCL's ring moves fewer bytes per link, stay on NCCL
(engine.tp.group.DistGroup decides, the same way on every rank since every rank sees the same
shapes).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.core.collectives import ONE_SHOT_MAX_BYTES

MAX_NORM_DIM = 16384  # a row is one program's registers (kernels.all_reduce with the norm)
GROUP_PREFIX = "tensor-parallel-"  # + the engine's port: the name its symmetric-memory group goes by


class SymmetricAllReduce:
    def __init__(self, rank: int, world: int, data, flags, handles) -> None:
        self.rank, self.world = rank, world
        self._data, self._flags, self._handles = data, flags, handles  # keep the mappings alive
        device = data.device
        self.data_ptrs = torch.tensor(handles[0].buffer_ptrs, dtype=torch.int64, device=device)
        self.flag_ptrs = torch.tensor(handles[1].buffer_ptrs, dtype=torch.int64, device=device)
        from kernels import all_reduce  # Triton: allocate() checked that it imports

        self._kernels = all_reduce
        self.counters = torch.zeros(all_reduce.MAX_PROGRAMS, dtype=torch.int32, device=device)

    def _state(self, x: torch.Tensor) -> tuple:
        slot_elems = ONE_SHOT_MAX_BYTES // x.element_size()
        return self.data_ptrs, self.flag_ptrs, self.counters, slot_elems, self.rank, self.world

    @staticmethod
    def allocate(rank: int, world: int, device: torch.device, port: int) -> tuple:
        """This rank's half of the setup, no collective: enable symmetric memory for this engine's
        group and allocate the buffers. Raises RuntimeError where this torch, machine or process
        cannot.

        NOTE: torch keeps process-wide registries of symmetric-memory groups whose entries cannot
        be replaced, and its rendezvous numbers the store keys it exchanges by a per-process count.
        The default process group's name repeats for each engine a process starts, so each engine
        registers its group under a name of its own (GROUP_PREFIX + its port; that registry is
        cleared when the group is destroyed). The count cannot be matched: a second engine's fresh
        workers would start theirs at zero while this process's goes on, and the rendezvous would
        wait forever, so a process that set up one engine's buffers sets up no other's."""
        try:
            import torch.distributed._symmetric_memory as symm_mem
            from torch._C._distributed_c10d import _register_process_group
        except ImportError as error:
            raise RuntimeError(f"this torch has no symmetric memory: {error}") from None
        # torch's own record of the groups this process enabled (no public accessor)
        earlier = [n for n in getattr(symm_mem, "_group_name_to_store", {}) if n.startswith(GROUP_PREFIX)]
        if earlier:
            raise RuntimeError("an earlier tensor-parallel engine in this process set up symmetric memory, "
                               "and torch's rendezvous cannot be repeated with new workers")
        try:  # the kernel is Triton's, an optional dependency (the gpu extra)
            from kernels.all_reduce import MAX_PROGRAMS
        except ImportError as error:
            raise RuntimeError(f"the one-shot all-reduce needs Triton: {error}") from None
        name = f"{GROUP_PREFIX}{port}"
        try:
            _register_process_group(name, dist.distributed_c10d._get_default_group())
            symm_mem.enable_symm_mem_for_group(name)
            data = symm_mem.empty(2 * world * ONE_SHOT_MAX_BYTES, dtype=torch.uint8, device=device)
            flags = symm_mem.empty(MAX_PROGRAMS * world, dtype=torch.int32, device=device)
            flags.zero_()
        except Exception as error:  # noqa: BLE001 - any failure here means NCCL
            raise RuntimeError(f"symmetric memory unavailable: {type(error).__name__}: {error}") from None
        return symm_mem, name, data, flags

    @classmethod
    def connect(cls, rank: int, world: int, allocated: tuple) -> SymmetricAllReduce:
        """Collective, once every rank's allocate() succeeded: map the peers' buffers, then check
        the kernel against NCCL. Raises RuntimeError if they disagree."""
        symm_mem, name, data, flags = allocated
        try:
            handles = (symm_mem.rendezvous(data, name), symm_mem.rendezvous(flags, name))
        except Exception as error:  # noqa: BLE001
            raise RuntimeError(f"symmetric memory rendezvous failed: {type(error).__name__}: {error}") from None
        torch.cuda.synchronize(data.device)
        dist.barrier()  # every rank's flags are zero before any rank signals
        reducer = cls(rank, world, data, flags, handles)
        reducer.check_against_nccl(data.device)
        return reducer

    def applies(self, x: torch.Tensor) -> bool:
        return x.is_cuda and x.is_contiguous() and x.numel() * x.element_size() <= ONE_SHOT_MAX_BYTES

    def applies_to_norm(self, x: torch.Tensor, residual: torch.Tensor) -> bool:
        return (self.applies(x) and x.dim() == 2 and x.shape[1] <= MAX_NORM_DIM and residual.is_contiguous()
                and residual.shape == x.shape and residual.dtype == x.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (x must satisfy applies())."""
        return self._kernels.one_shot_all_reduce_(x, self._state(x))

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(sum(x) + residual), sum(x) + residual) in one launch (x, residual must satisfy
        applies_to_norm())."""
        return self._kernels.one_shot_all_reduce_add_rms_norm(x, residual, weight, eps, self._state(x))

    def check_against_nccl(self, device: torch.device) -> None:
        """Both ways on rank-dependent values, three calls (both slots and back): raise unless they agree."""
        for calls, rows in ((1, 1), (2, 700), (3, 33)):
            x = torch.arange(rows * 1024, dtype=torch.float32, device=device).remainder(97) * (self.rank + 1)
            expected = x.clone()
            dist.all_reduce(expected)
            for _ in range(calls):
                got = self(x.clone())
            if not torch.equal(got, expected):
                raise RuntimeError(f"the one-shot all-reduce disagrees with NCCL on {rows} x 1024 float32 "
                                   f"(max gap {(got - expected).abs().max().item():.3g})")
