"""A checkpoint's weight files and the page cache: drop them from it (so the next load reads the
disk) and say how much of them it holds (mincore over a private mapping), for the cold-start probe."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path


def weight_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


def weight_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in weight_files(folder))


def drop(folder: Path) -> None:
    """Write back and drop the weight files' pages (POSIX_FADV_DONTNEED: no root needed; a page
    another process maps stays)."""
    for path in weight_files(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(folder: Path) -> float:
    """The fraction of the weight files' pages in the page cache; NaN where mincore is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mincore = libc.mincore
    except (OSError, AttributeError):
        return float("nan")
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
    resident = total = 0
    for path in weight_files(folder):
        size = path.stat().st_size
        if not size:
            continue
        pages = -(-size // mmap.PAGESIZE)
        vector = (ctypes.c_ubyte * pages)()
        with open(path, "rb") as f:
            # a private, writable mapping only so that ctypes can take its address; nothing is written
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        start = ctypes.c_char.from_buffer(mapped)
        try:
            if mincore(ctypes.addressof(start), size, vector) != 0:
                return float("nan")
        finally:
            del start
            mapped.close()
        resident += sum(v & 1 for v in vector)
        total += pages
    return resident / total if total else float("nan")
