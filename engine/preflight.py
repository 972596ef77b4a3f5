"""What the executor reads and checks before it loads a model: the device, the checkpoint's
config files (positions, end-of-sequence ids) and whether the settings fit the model and the host.
Each check raises a one-line ValueError naming the setting, before any weights load or workers spawn.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.config import SchedulerConfig
from engine.core.expert_parallel import check_expert_parallel
from engine.core.model_shapes import ModelShape


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("EngineConfig.device='cuda' but torch.cuda.is_available() is False; use 'cpu' or 'auto'")
    return torch.device(name)


def read_eos_token_ids(model_dir: str | Path, hf_config) -> tuple[int, ...]:
    """End-of-sequence ids, primary first: generation_config.json, then config.json.

    Qwen3 lists two (<|im_end|>, <|endoftext|>); the scheduler stops on the primary one and
    LLM.generate turns the others into stop tokens, as vLLM does.
    """
    ids: list[int] = []
    path = Path(model_dir) / "generation_config.json"
    sources = [json.loads(path.read_text()).get("eos_token_id")] if path.is_file() else []
    sources.append(getattr(hf_config, "eos_token_id", None))
    for value in sources:
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return tuple(ids)


# A folder holding none of these has no tokenizer: transformers would make an empty placeholder
# (Qwen2's, whose only token <|endoftext|> is id 0, taken for end of sequence) or fail (Llama's).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer(model_dir: str | Path) -> bool:
    return any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)


def read_model_config(model_dir: str | Path) -> dict | None:
    """The checkpoint's config.json as a dict; None when it is missing (the loader reports that)."""
    config_path = Path(model_dir) / "config.json"
    return json.loads(config_path.read_text()) if config_path.is_file() else None


def max_position_embeddings(model_dir: str | Path) -> int | None:
    value = (read_model_config(model_dir) or {}).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_max_model_len(engine_config: EngineConfig, scheduler_config: SchedulerConfig) -> None:
    """Reject a max_model_len beyond the positions the model was built for, before loading it."""
    max_positions = max_position_embeddings(engine_config.model)
    if max_positions is not None and scheduler_config.max_model_len > max_positions:
        raise ValueError(
            f"max_model_len={scheduler_config.max_model_len} exceeds the model's max_position_embeddings="
            f"{max_positions} ({Path(engine_config.model) / 'config.json'}); set max_model_len <= {max_positions}"
        )


def check_tensor_parallel(engine_config: EngineConfig, device: torch.device) -> None:
    """Reject a tensor_parallel_size the model or the host cannot split over, before spawning."""
    tp = engine_config.execution.tensor_parallel_size
    if device.type == "cuda" and tp > torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size={tp} exceeds the {torch.cuda.device_count()} visible CUDA devices")
    if engine_config.execution.all_reduce == "symmetric" and device.type != "cuda":
        raise ValueError(f"all_reduce='symmetric' needs CUDA devices, got {device.type}: use 'auto' or 'nccl'")
    config = read_model_config(engine_config.model)
    if config is None:
        return
    shape = ModelShape.from_hf_config(config)
    check_expert_parallel(shape, tp, engine_config.execution.expert_parallel)
    kv_ok = shape.num_kv_heads % tp == 0 or tp % shape.num_kv_heads == 0
    if shape.num_heads % tp or shape.intermediate_size % tp or not kv_ok:
        raise ValueError(
            f"tensor_parallel_size={tp} must divide num_attention_heads={shape.num_heads} and "
            f"intermediate_size={shape.intermediate_size}, and divide or be a multiple of "
            f"num_key_value_heads={shape.num_kv_heads}"
        )


def describe_device(device: torch.device, dtype: torch.dtype) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return f"{name}, {str(dtype).removeprefix('torch.')}"
