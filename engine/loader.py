"""Load a Hugging Face-format checkpoint directory into the model class its config.json names
(engine.models.build_model, by model_type).

Every checkpoint tensor goes through the weight_loader of the parameter it maps to, which takes
this rank's shard; q/k/v and gate/up land in their fused parameters by shard id. Every
parameter (every shard of a fused one) must be filled exactly by the checkpoint: anything
missing, extra or mis-shaped is an error naming the file and the tensor.

Every problem with the checkpoint itself raises CheckpointError (a ValueError, so callers that
turn bad user input into one line catch it); a folder or file that is not there raises
CheckpointNotFoundError, which is also a FileNotFoundError.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.registry import get_attention_backend
from engine.dummy import init_dummy_weights
from engine.layers.linear import ShardId
from engine.layers.parallel import Collective, FusedReduceNorm, TensorParallel
from engine.models import DecoderForCausalLM, build_model
from engine.weight_reader import CheckpointError, CheckpointNotFoundError, read_tensors

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Tensors some checkpoints carry that the model derives itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

__all__ = ["CheckpointError", "CheckpointNotFoundError", "load_model", "load_weights", "resolve_dtype"]


def resolve_dtype(config: dict[str, Any], override: str | torch.dtype | None, config_path: Path) -> torch.dtype:
    from_config = config.get("torch_dtype") or config.get("dtype") or "float32"
    value = override if override not in (None, "auto") else from_config
    if isinstance(value, torch.dtype):
        if value not in _DTYPES.values():
            raise ValueError(f"dtype={value} is not supported; expected one of {sorted(_DTYPES)}")
        return value
    if value not in _DTYPES:
        where = "dtype" if override not in (None, "auto") else f"torch_dtype in {config_path}"
        raise ValueError(f"{where}={value!r} is not supported; expected one of {sorted(_DTYPES)}")
    return _DTYPES[value]


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype | None = None,
    device: torch.device | str = "cpu",
    attention_backend: str | AttentionBackend = "torch",
    tp_rank: int = 0,
    tp_size: int = 1,
    all_reduce: Collective | None = None,
    all_gather: Collective | None = None,
    fused_reduce_norm: FusedReduceNorm | None = None,
    load_format: str = "auto",
    expert_parallel: bool = False,
    weight_read: str = "auto",
) -> tuple[DecoderForCausalLM, Any]:
    """Returns (model in eval mode, transformers PretrainedConfig of the checkpoint).

    dtype None or "auto" takes the config's torch_dtype; attention_backend is a registry name
    ("auto", "torch", "triton", "flash_attn") or a backend object. For tp_size > 1 the model
    holds rank tp_rank's shard and all_reduce/all_gather combine ranks (fused_reduce_norm, where
    the group has one, sums and normalises in one launch). load_format "dummy" reads only the
    folder's config.json and fills the weights at random on the device (engine.dummy).
    expert_parallel: a mixture-of-experts rank holds (and reads) only its num_experts / tp_size
    whole experts (engine.layers.moe). weight_read: how the files are read onto the device
    (engine.weight_reader.READ_MODES; "auto": streamed onto a GPU, mapped onto the CPU).
    """
    from transformers import AutoConfig  # heavy import, only needed here

    root = Path(model_dir)
    if not root.is_dir():
        what = "is a file, not a model directory" if root.exists() else "does not exist"
        raise CheckpointNotFoundError(f"model directory {root} {what}")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise CheckpointNotFoundError(f"{config_path} is missing: not a Hugging Face model directory")
    raw_config = json.loads(config_path.read_text())
    torch_dtype = resolve_dtype(raw_config, dtype, config_path)
    hf_config = AutoConfig.from_pretrained(root)
    if isinstance(attention_backend, str):
        attention_backend = get_attention_backend(attention_backend, device)
    tp = TensorParallel(tp_rank, tp_size, all_reduce, all_gather, fused_reduce_norm, expert_parallel)
    model = build_model(hf_config, attention_backend, tp, dtype=torch_dtype, device=device)
    if load_format == "dummy":
        init_dummy_weights(model)
    elif load_format == "auto":
        started = time.perf_counter()
        load_weights(model, root, weight_read)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        model.weights_load_s = time.perf_counter() - started
    else:
        raise ValueError(f"load_format must be one of ('auto', 'dummy'), got {load_format!r}")
    return model.eval(), hf_config


def _weight_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [root / n for n in names]
        for f in files:
            if not f.is_file():
                raise CheckpointNotFoundError(f"{f} is listed in {index} but missing")
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointNotFoundError(f"no *.safetensors weights in {root}")
    return files


def load_weights(model: DecoderForCausalLM, root: Path, read_mode: str = "auto") -> None:
    """Fill every parameter from the checkpoint's files (engine.weight_reader reads them onto the
    model's device, read_mode one of its READ_MODES: "auto" streams onto a GPU and maps onto the
    CPU; the parameters' weight loaders take this rank's shard there)."""
    device = model.lm_head.weight.device
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.shape.tie_word_embeddings
    # Which (parameter, shard) pairs must be filled: one per HF tensor the model consumes.
    expected: dict[tuple[str, ShardId], str] = {}
    for name, _ in model.named_parameters():  # deduplicated: a tied head is the embedding
        for hf_name in model.checkpoint_names(name):
            expected[model.checkpoint_target(hf_name)] = hf_name
    seen: set[tuple[str, ShardId]] = set()
    for path in _weight_files(root):
        for hf_name, tensor in read_tensors(path, device, read_mode):
            if hf_name.endswith(_IGNORED_SUFFIXES) or (tied and hf_name == "lm_head.weight"):
                continue
            key = model.checkpoint_target(hf_name)
            if key[0] not in params:
                raise CheckpointError(f"{path}: unexpected tensor {hf_name!r} (no such parameter in the model)")
            param = params[key[0]]
            try:
                param.weight_loader(param, tensor, key[1])
            except ValueError as e:
                raise CheckpointError(f"{path}: tensor {hf_name!r}: {e}") from None
            seen.add(key)
            if key[1] is None:  # a whole-parameter tensor (packed experts) fills every shard of it
                seen.update(k for k in expected if k[0] == key[0])
    missing = sorted(hf for key, hf in expected.items() if key not in seen)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(f"{root}: checkpoint lacks {len(missing)} tensor(s) the model needs: {shown}")

