"""EngineExecutor.startup_s: each start-up phase timed (the calibration of an autoscaled fleet's cold
start reads them), on CPU and, with graphs captured, on CUDA."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.core import CacheConfig, SchedulerConfig

torch = pytest.importorskip("torch")

SCHEDULER = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256)


def _startup(model_dir, device: str) -> dict[str, float]:
    from engine.executor import EngineExecutor

    executor = EngineExecutor(EngineConfig(model=str(model_dir), device=device), SCHEDULER, CacheConfig(block_size=16))
    try:
        return executor.startup_s
    finally:
        executor.shutdown()


def test_every_phase_is_timed_on_cpu(tiny_qwen3_dir):
    phases = _startup(tiny_qwen3_dir, "cpu")
    assert list(phases) == ["load", "kv_cache", "capture", "warm_up"]
    assert phases["load"] > 0 and all(v >= 0 for v in phases.values())
    assert phases["capture"] < 0.01  # no graphs on CPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_capture_is_timed_on_cuda(tiny_qwen3_dir):
    phases = _startup(tiny_qwen3_dir, "cuda")
    assert phases["capture"] > 0.05 and phases["load"] > 0 and phases["kv_cache"] > 0
