"""Copies a step's index arrays to the device: one host buffer and one transfer per dtype.

Each array starts on a 16-byte boundary of the buffer: Triton specialises its kernels on the
alignment of pointer arguments, so an array whose offset moved with the batch size would make a
kernel recompile in the middle of a run.

On CUDA the host buffers are pinned and reused, and the copy is non-blocking; an event recorded
after each copy guards its buffer against being refilled while the copy is in flight. Each dtype
has a ring of RING buffers used in turn: with steps overlapped, the host fills the next step's
buffers while the device still runs the previous step, and a copy queued behind that step must
not be waited for (waiting on it would stall the host until the whole step ran). On CPU the
"upload" is a fresh tensor per step (callers may keep a step's inputs).
"""

from __future__ import annotations

import numpy as np
import torch

ALIGN_BYTES = 16
# Buffers per dtype: a step uploads at most two arrays' groups of one dtype (the runner's batch
# and its placeholder map), and a buffer comes round again only two steps later.
RING = 4


def segment_offsets(sizes: list[int], itemsize: int) -> tuple[list[int], int]:
    """Start of each array (in elements) when each starts 16-byte aligned, and the total length."""
    step = max(1, ALIGN_BYTES // itemsize)
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // step) * step
    return offsets, end


class HostStaging:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self._buffers: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self._events: dict[tuple[torch.dtype, int], torch.cuda.Event] = {}
        self._turn: dict[torch.dtype, int] = {}

    def upload(
        self, arrays: list[np.ndarray], dtype: torch.dtype, out: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """The arrays, concatenated, in one copy; returned as views shaped like the arrays.

        out: a device buffer to copy into (from its start) instead of a fresh tensor.
        """
        sizes = [a.size for a in arrays]
        offsets, total = segment_offsets(sizes, dtype.itemsize)
        slot = (dtype, self._turn.get(dtype, 0))
        if self.pinned:
            self._turn[dtype] = (slot[1] + 1) % RING
        host = self._pinned(slot, total) if self.pinned else torch.empty(total, dtype=dtype)
        view = host.numpy()
        for a, start in zip(arrays, offsets):
            view[start: start + a.size] = a.ravel()
        if out is not None:
            if out.numel() < total:
                raise ValueError(f"staging buffer holds {out.numel()} values, the batch needs {total}")
            flat = out[:total]
            flat.copy_(host, non_blocking=self.pinned)
        elif self.pinned:
            flat = host.to(self.device, non_blocking=True)
        else:
            flat = host
        if self.pinned:
            event = self._events.setdefault(slot, torch.cuda.Event())
            event.record()
        return [flat[start: start + a.size].view(a.shape) for a, start in zip(arrays, offsets)]

    def _pinned(self, slot: tuple[torch.dtype, int], size: int) -> torch.Tensor:
        event = self._events.get(slot)
        if event is not None:
            event.synchronize()  # the previous copy out of this buffer has finished
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(max(size, 2 * (0 if buffer is None else buffer.numel()), 4096),
                                 dtype=slot[0], pin_memory=True)
            self._buffers[slot] = buffer
        return buffer[:size]
