"""Copies a step's index arrays to the device: one host buffer and one transfer per dtype.

On CUDA the host buffer is pinned and reused, and the copy is non-blocking; an event recorded
after each copy guards the buffer against being refilled while a copy is in flight. On CPU the
"upload" is a fresh tensor per step (callers may keep a step's inputs).
"""

from __future__ import annotations

import numpy as np
import torch


class HostStaging:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        self._events: dict[torch.dtype, torch.cuda.Event] = {}

    def upload(self, arrays: list[np.ndarray], dtype: torch.dtype, out: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The arrays, concatenated, in one copy; returned as views shaped like the arrays.

        out: a device buffer to copy into (from its start) instead of a fresh tensor.
        """
        sizes = [a.size for a in arrays]
        total = sum(sizes)
        host = self._pinned(dtype, total) if self.pinned else torch.empty(total, dtype=dtype)
        np.concatenate([a.ravel() for a in arrays], out=host.numpy())
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
            event = self._events.setdefault(dtype, torch.cuda.Event())
            event.record()
        return [part.view(a.shape) for part, a in zip(flat.split(sizes), arrays)]

    def _pinned(self, dtype: torch.dtype, size: int) -> torch.Tensor:
        event = self._events.get(dtype)
        if event is not None:
            event.synchronize()  # the previous copy out of this buffer has finished
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(max(size, 2 * (0 if buffer is None else buffer.numel()), 4096),
                                 dtype=dtype, pin_memory=True)
            self._buffers[dtype] = buffer
        return buffer[:size]
