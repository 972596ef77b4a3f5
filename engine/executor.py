"""EngineExecutor: the real model behind the core's Executor protocol (one process, one device).

It resolves device and dtype, loads the checkpoint, sizes and allocates the KV cache, and
times each step on the wall clock (synchronising CUDA, so the time is the step's, not the
launch's). Tensor parallelism (issue 5) will be a sibling executor with worker processes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.plan import KVCacheSpec, StepPlan, StepResult
from engine.loader import load_model
from engine.runner import ModelRunner


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("EngineConfig.device='cuda' but torch.cuda.is_available() is False; use 'cpu' or 'auto'")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """None means "the checkpoint's dtype" (the loader reads it from config.json)."""
    if name == "auto":
        # bfloat16 matmuls on CPU are slow and too imprecise for the differential tests.
        return torch.float32 if device.type == "cpu" else None
    return getattr(torch, name)


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


class EngineExecutor:
    def __init__(self, engine_config: EngineConfig, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig) -> None:
        if engine_config.tensor_parallel_size != 1:
            raise NotImplementedError(
                f"tensor_parallel_size={engine_config.tensor_parallel_size}: this executor runs one device; "
                "tensor parallelism needs the multi-process executor"
            )
        self.config = engine_config
        self.device = resolve_device(engine_config.device)
        backend = engine_config.attention_backend
        if backend == "auto" and self.device.type == "cpu":
            backend = "torch"  # "auto" in the registry looks only at CUDA's presence, not at our device
        model, hf_config = load_model(
            engine_config.model,
            dtype=resolve_dtype(engine_config.dtype, self.device),
            device=str(self.device),
            attention_backend=backend,
        )
        self.hf_config = hf_config
        self.runner = ModelRunner(model, hf_config, engine_config, scheduler_config, cache_config, self.device)
        self.runner.allocate_kv_cache(self.runner.determine_num_blocks())
        self._spec = KVCacheSpec(self.runner.num_blocks, self.runner.block_size)
        self.vocab_size = self.runner.arch.vocab_size
        self.eos_token_ids = read_eos_token_ids(engine_config.model, hf_config)
        self._tokenizer = None
        if not self.eos_token_ids and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids = (self.tokenizer.eos_token_id,)
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer, loaded on first use (token-id workloads never need it)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.config.model)
        return self._tokenizer

    def kv_cache_spec(self) -> KVCacheSpec:
        return self._spec

    def execute(self, plan: StepPlan) -> StepResult:
        if self.runner is None:
            raise RuntimeError("EngineExecutor.execute() after shutdown()")
        start = time.perf_counter()
        tokens = self.runner.execute(plan)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepResult(tokens, time.perf_counter() - start)

    def shutdown(self) -> None:
        """Release the KV cache and the weights; the executor cannot run steps afterwards."""
        if self.runner is None:
            return
        self.runner.free_kv_cache()
        self.runner = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
