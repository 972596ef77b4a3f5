"""Read the tensors of a safetensors file onto the model's device.

Onto a GPU ("streamed", the default there; experiments/autoscale/load_bench.py measured it on an
H100 at 2.3x the bytes/s of "mapped" from the page cache and 1.24x from disk): the file's tensors
are grouped into batches of adjacent tensors (BATCH_BYTES, or one tensor where it is larger);
READERS threads pread each batch's bytes in CHUNK_BYTES pieces into pinned host buffers ahead of
the copies (large reads, no page faults of a memory map, the disk or page cache read in parallel),
each piece is copied asynchronously into the batch's device buffer, and the batch's tensors are
slices of that buffer: dtype conversion and the packing into fused parameters then run on the GPU
(the weight loaders' copy_). Reading tensor by tensor from the memory map ("mapped") copies each
from pageable memory through the driver's staging buffer, synchronously, one tensor at a time; it
stays selectable (EngineConfig.weight_read="mapped").

Onto the CPU ("mapped", the default there): each tensor is a view of the memory map, copied once,
into its parameter (a read into a buffer first would copy every byte twice).

A file whose header or length does not hold its tensors raises CheckpointError naming the file.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import WEIGHT_READS

BATCH_BYTES = 256 << 20  # device memory held by one batch's buffer while its tensors are loaded
CHUNK_BYTES = 32 << 20  # one read, into one pinned host buffer (2 x READERS of them)
READERS = 4  # threads reading the file at once
_HEADER_LIMIT = 100 << 20  # safetensors' own bound on the JSON header
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class CheckpointError(ValueError):
    """The checkpoint cannot be loaded; the message names the path (and the tensor where known)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint folder, its config.json or a weight file is missing."""


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # byte offsets in the file
    end: int


def read_header(path: Path) -> list[Entry]:
    """The file's tensors in file order, each checked against its dtype, shape and the file's length."""
    bad = f"{path}: not a readable safetensors file (truncated or corrupt?)"
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{bad}: {size} bytes")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(_HEADER_LIMIT, size - 8):
                raise CheckpointError(f"{bad}: a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{bad}: {error}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{bad}: its header is not a JSON object")
    start = 8 + length
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = _DTYPES[info["dtype"]], tuple(int(d) for d in info["shape"]), \
                info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{bad}: tensor {name!r} has no valid dtype, shape and data_offsets") from None
        nbytes = math.prod(shape) * dtype.itemsize
        if not 0 <= begin <= end or end - begin != nbytes or start + end > size:
            raise CheckpointError(f"{path}: tensor {name!r} cannot be read (truncated or corrupt file?): bytes "
                                  f"{begin}-{end} of a data section of {size - start}, {nbytes} expected")
        entries.append(Entry(name, dtype, shape, start + begin, start + end))
    return sorted(entries, key=lambda e: e.begin)


def batches(entries: list[Entry], limit: int | None = None) -> list[list[Entry]]:
    """Runs of tensors adjacent in the file spanning at most limit bytes (a larger tensor: alone)."""
    limit = BATCH_BYTES if limit is None else limit
    out: list[list[Entry]] = []
    for entry in entries:
        if out and entry.end - out[-1][0].begin <= limit:
            out[-1].append(entry)
        else:
            out.append([entry])
    return out


def _pread(fd: int, path: Path, into: torch.Tensor, offset: int) -> None:
    view = into.numpy().data  # a memoryview over the tensor's bytes
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise CheckpointError(f"{path}: ends at byte {offset + got} inside its tensors "
                                  "(truncated or corrupt file?)")
        got += n


class _Streamer:
    """The file's byte ranges onto the GPU: READERS threads pread CHUNK_BYTES pieces into pinned
    buffers ahead of the copies (the page cache or disk read in parallel, the GIL released), and
    each piece is copied to its batch's device buffer on the current stream as soon as it is in."""

    def __init__(self, fd: int, path: Path, device: torch.device, spans: list[tuple[int, int]]) -> None:
        self.fd, self.path, self.device, self.spans = fd, path, device, spans
        # every piece of every span, in order: (span, file offset, bytes)
        self.pieces = [(k, at, min(CHUNK_BYTES, end - at)) for k, (begin, end) in enumerate(spans)
                       for at in range(begin, end, CHUNK_BYTES)]
        slots = min(2 * READERS, len(self.pieces))
        size = max((n for _, _, n in self.pieces), default=0)
        self.pinned = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(slots)]
        self.copied: list[torch.cuda.Event | None] = [None] * slots
        self.pool = ThreadPoolExecutor(READERS, thread_name_prefix="weight-reader")
        self.reads: dict[int, Future[None]] = {}
        for i in range(slots):
            self._submit(i)
        self.next = 0

    def _submit(self, i: int) -> None:
        if i < len(self.pieces):
            slot = i % len(self.pinned)
            _, at, n = self.pieces[i]
            self.reads[i] = self.pool.submit(self._read, self.copied[slot], self.pinned[slot][:n], at)

    def _read(self, copied: torch.cuda.Event | None, into: torch.Tensor, at: int) -> None:
        if copied is not None:
            copied.synchronize()  # the copy out of this pinned buffer has finished
        _pread(self.fd, self.path, into, at)

    def span(self, k: int) -> torch.Tensor:
        """Span k's bytes (spans are asked for in order) as a uint8 tensor on the device."""
        begin, end = self.spans[k]
        out = torch.empty(end - begin, dtype=torch.uint8, device=self.device)
        stream = torch.cuda.current_stream(self.device)
        while self.next < len(self.pieces) and self.pieces[self.next][0] == k:
            i, slot = self.next, self.next % len(self.pinned)
            _, at, n = self.pieces[i]
            self.reads.pop(i).result()
            out[at - begin:at - begin + n].copy_(self.pinned[slot][:n], non_blocking=True)
            self.copied[slot] = event = torch.cuda.Event()
            event.record(stream)
            self.next += 1
            self._submit(i + len(self.pinned))
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _mapped(path: Path, entries: list[Entry], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor a view of the file's memory map (copy-on-write: writable, never written), moved
    to the device on its own: no copy at all before the parameter's on the CPU."""
    with open(path, "rb") as f:
        # left open: the tensors hold it (torch.frombuffer takes a reference) and it closes with them
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    data = torch.frombuffer(mapped, dtype=torch.uint8)
    for e in entries:
        raw = data[e.begin:e.end]
        if e.begin % e.dtype.itemsize:
            raw = raw.clone()  # an odd offset: an aligned copy to view as the dtype
        yield e.name, raw.view(e.dtype).view(e.shape).to(device)


def _streamed(path: Path, entries: list[Entry], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    groups = batches(entries)
    spans = [(g[0].begin - g[0].begin % 8, g[-1].end) for g in groups]
    fd = os.open(path, os.O_RDONLY)
    streamer = None
    try:
        streamer = _Streamer(fd, path, device, spans)
        for k, (group, (base, _)) in enumerate(zip(groups, spans)):
            data = streamer.span(k)
            for e in group:
                raw = data[e.begin - base:e.end - base]
                if (e.begin - base) % e.dtype.itemsize:
                    raw = raw.clone()  # an odd offset: an aligned copy to view as the dtype
                yield e.name, raw.view(e.dtype).view(e.shape)
    finally:
        if streamer is not None:
            streamer.close()
        os.close(fd)


READ_MODES = WEIGHT_READS


def resolve_mode(mode: str, device: torch.device) -> str:
    """The read mode taken onto device: "auto" is "streamed" onto a GPU and "mapped" elsewhere."""
    if mode not in READ_MODES:
        raise ValueError(f"mode must be one of {READ_MODES}, got {mode!r}")
    if mode == "auto":
        return "streamed" if device.type == "cuda" else "mapped"
    if mode == "streamed" and device.type != "cuda":
        raise ValueError(f"mode='streamed' reads through pinned memory onto a GPU, not onto {device}")
    return mode


def read_tensors(path: Path, device: torch.device, mode: str = "auto") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor on device) for each tensor of the file, in file order; copy each into its
    parameter before asking for the next (a mapped one is a view of the file). mode: "mapped"
    (tensor by tensor from the memory map), "streamed" (batches through pinned buffers, CUDA only)
    or "auto" (streamed onto a GPU, mapped onto the CPU)."""
    streamed = resolve_mode(mode, device) == "streamed"
    entries = read_header(path)
    try:
        yield from (_streamed if streamed else _mapped)(path, entries, device)
    except OSError as error:
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt?): {error}") from None
