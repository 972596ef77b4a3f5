"""Where a step's time goes, phase by phase, on the host and on the device.

Phases: prepare (host index arrays and their upload), forward (the model, eager or a graph
replay), sample (logits, sampler, and the wait for the sampled ids; with overlapped steps the
sampler's launches only, as the wait happens later). Host times are wall time
spent in Python per phase; device times come from CUDA events at the same boundaries, so no
extra synchronisation is added (the step already waits for its sampled ids at the end).
Off by default: the runner calls a timer only when one is attached.
"""

from __future__ import annotations

import time

import torch

PHASES = ("prepare", "forward", "sample")


class StepTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.records: list[dict[str, float | int | bool]] = []
        self._host: list[float] = []
        self._events: list[torch.cuda.Event] = []

    def mark(self) -> None:
        """Call at the start of the step and at the end of each phase (4 marks a step)."""
        self._host.append(time.perf_counter())
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events.append(event)

    def finish(self, **fields: float | int | bool) -> None:
        """Close the step: one record with host_<phase>_s, gpu_<phase>_s and the given fields."""
        self.record(*self.detach(), **fields)

    def detach(self) -> tuple[list[float], list[torch.cuda.Event]]:
        """This step's marks, taken out so the next step can start marking before this one ends
        (overlapped steps); pass them to record() once the step is done."""
        marks = (self._host, self._events)
        self._host, self._events = [], []
        return marks

    def record(self, host: list[float], events: list[torch.cuda.Event], **fields: float | int | bool) -> None:
        if len(host) != len(PHASES) + 1:
            return  # a step that ended early (nothing sampled) is not a full record
        record: dict[str, float | int | bool] = dict(fields)
        for i, phase in enumerate(PHASES):
            record[f"host_{phase}_s"] = host[i + 1] - host[i]
        if events:
            events[-1].synchronize()
            for i, phase in enumerate(PHASES):
                record[f"gpu_{phase}_s"] = events[i].elapsed_time(events[i + 1]) / 1e3
        self.records.append(record)
