"""Attention backends by name. Each entry imports its module only when asked for, so the GPU
backends (Triton, flash-attn) cost nothing on machines that cannot run them."""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch

from engine.attention.backend import AttentionBackend
from engine.config import ATTENTION_BACKENDS


def _torch() -> AttentionBackend:
    from engine.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend()


def _triton() -> AttentionBackend:
    from engine.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()


def _flash_attn() -> AttentionBackend:
    from engine.attention.flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend()


_FACTORIES: dict[str, Callable[[], AttentionBackend]] = {
    "torch": _torch,
    "triton": _triton,
    "flash_attn": _flash_attn,
}
_REQUIRED_PACKAGE = {"triton": "triton", "flash_attn": "flash_attn"}


def _available(name: str) -> bool:
    package = _REQUIRED_PACKAGE.get(name)
    return package is None or importlib.util.find_spec(package) is not None


# flash-attn 2 reads a paged cache only in pages of a multiple of 256 tokens.
FLASH_ATTN_PAGE_MULTIPLE = 256


def get_attention_backend(
    name: str, device: torch.device | str | None = None, block_size: int | None = None
) -> AttentionBackend:
    """"auto" picks flash_attn, then triton, when the device is CUDA and they import; else torch.

    device: where the model runs; None means CUDA if available. block_size: the KV block size, so
    that "auto" passes over flash_attn for blocks it cannot page and an explicit "flash_attn" is
    refused for them (None: assume it can page them).
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend={name!r} is unknown; expected one of {ATTENTION_BACKENDS}")
    if name != "auto":
        if name == "flash_attn" and block_size is not None and block_size % FLASH_ATTN_PAGE_MULTIPLE:
            # refused here, before a model is loaded, rather than at the first forward
            raise ValueError(f"attention_backend='flash_attn' needs block_size to be a multiple of "
                             f"{FLASH_ATTN_PAGE_MULTIPLE} (flash-attn's paged KV limit), got {block_size}")
        if not _available(name):
            raise ValueError(f"attention_backend={name!r} needs the {_REQUIRED_PACKAGE[name]!r} package")
        return _FACTORIES[name]()
    on_cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_cuda:
        for candidate in ("flash_attn", "triton"):
            if candidate == "flash_attn" and block_size is not None and block_size % FLASH_ATTN_PAGE_MULTIPLE:
                continue
            if _available(candidate):
                try:
                    return _FACTORIES[candidate]()
                except ImportError:
                    continue  # wrapper not written yet or a broken install: fall through
    return _FACTORIES["torch"]()
