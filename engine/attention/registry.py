"""Attention backends by name (backend.attention_backend). Each entry imports its module only when
called, so the GPU backends (Triton, flash-attn) cost nothing on machines that cannot run them,
and the names are known without torch (engine.config validates against them). "auto" is no
entry: get_attention_backend picks one for the device and the KV cache."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.core.registry import Registry

if TYPE_CHECKING:
    import torch

    from engine.attention.backend import AttentionBackend

ATTENTION: Registry[Callable[[], AttentionBackend]] = Registry("attention_backend")


@ATTENTION.register("torch")
def _torch() -> AttentionBackend:
    from engine.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend()


@ATTENTION.register("triton")
def _triton() -> AttentionBackend:
    from engine.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()


@ATTENTION.register("flash_attn")
def _flash_attn() -> AttentionBackend:
    from engine.attention.flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend()


# the names backend.attention_backend accepts
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", *ATTENTION.names())


def _problem(name: str, block_size: int | None, dtype: torch.dtype | None) -> str | None:
    """Why backend `name` cannot serve this cache here, or None."""
    if name == "triton" and importlib.util.find_spec("triton") is None:
        return "the 'triton' package is not installed"
    if name == "flash_attn":
        from engine.attention.flash_attn_backend import flash_attn_problem

        return flash_attn_problem(block_size, dtype)
    return None


def get_attention_backend(
    name: str, device: torch.device | str | None = None, block_size: int | None = None,
    dtype: torch.dtype | None = None,
) -> AttentionBackend:
    """"auto" on CUDA routes each phase to what was measured fastest for it
    (engine.attention.phases: flash-attn for eager prefills, Triton for decodes and prefill
    graphs) when both run here, else the one that does (flash_attn, then triton); elsewhere torch.

    device: where the model runs; None means CUDA if available. block_size and dtype: the KV
    cache's, so that "auto" passes over a backend that cannot serve it and an explicit name is
    refused for it before a model is loaded (None: not known, assume it can).
    """
    import torch

    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend={name!r} is unknown; expected one of {ATTENTION_BACKENDS}")
    if name != "auto":
        problem = _problem(name, block_size, dtype)
        if problem:
            raise ValueError(f"attention_backend={name!r}: {problem}")
        return ATTENTION.get(name)()
    on_cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if not on_cuda:
        return ATTENTION.get("torch")()
    usable = [n for n in ("flash_attn", "triton") if _problem(n, block_size, dtype) is None]
    if usable == ["flash_attn", "triton"]:
        from engine.attention.phases import PhaseRoutedBackend

        return PhaseRoutedBackend(ATTENTION.get("flash_attn")(), ATTENTION.get("triton")())
    return ATTENTION.get(usable[0] if usable else "torch")()
