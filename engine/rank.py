"""One rank's model runner: load the rank's shard of the checkpoint and wrap it in a ModelRunner.

Rank 0 (engine.executor) and every tensor-parallel worker (engine.tp.worker_main) build theirs
here, so that the worker needs nothing from the executor that spawns it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.attention import get_attention_backend
from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.kv_sizing import kv_cache_torch_dtype
from engine.loader import load_model
from engine.runner import ModelRunner


def resolve_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """None means "the checkpoint's dtype" (the loader reads it from config.json)."""
    if name == "auto":
        # bfloat16 matmuls on CPU are slow and too imprecise for the differential tests.
        return torch.float32 if device.type == "cpu" else None
    return getattr(torch, name)


def engine_dtype(engine_config: EngineConfig, device: torch.device) -> torch.dtype | None:
    """The dtype the model will run in: the configured one, else the checkpoint's (None: unreadable,
    the loader reports why)."""
    dtype = resolve_dtype(engine_config.dtype, device)
    if dtype is not None:
        return dtype
    config_path = Path(engine_config.model) / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    name = config.get("torch_dtype") or config.get("dtype")
    return getattr(torch, name, None) if isinstance(name, str) else None


def build_runner(engine_config: EngineConfig, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 device: torch.device, group=None) -> ModelRunner:
    """Load this rank's model (the whole model when group is None) and wrap it in a runner. Every
    rank resolves engine_config.attention_backend from the same inputs, so all run the same one."""
    tp = engine_config.execution.tensor_parallel_size
    backend = get_attention_backend(engine_config.attention_backend, device, cache_config.block_size,
                                    kv_cache_torch_dtype(cache_config.kv_cache_dtype,
                                                         engine_dtype(engine_config, device)))
    model, hf_config = load_model(
        engine_config.model,
        dtype=resolve_dtype(engine_config.dtype, device),
        device=str(device),
        attention_backend=backend,
        tp_rank=group.rank if group else 0,
        tp_size=tp,
        all_reduce=group.all_reduce if group else None,
        all_gather=group.all_gather if group else None,
        fused_reduce_norm=group.symmetric if group else None,
        load_format=engine_config.load_format,
        weight_read=engine_config.weight_read,
        expert_parallel=engine_config.execution.expert_parallel,
    )
    return ModelRunner(model, hf_config, engine_config, scheduler_config, cache_config, device,
                       driver=group is None or group.rank == 0, broadcast=group.broadcast if group else None,
                       all_gather=group.all_gather if group else None)
