"""EngineExecutor.startup_s: each start-up phase timed (the calibration of an autoscaled fleet's cold
start reads them), on CPU and, with graphs captured, on CUDA."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.core import CacheConfig, SchedulerConfig

torch = pytest.importorskip("torch")

SCHEDULER = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256)


def _startup(model_dir, device: str, enforce_eager: bool = False) -> dict[str, float]:
    from engine.config import ExecutionConfig
    from engine.executor import EngineExecutor

    config = EngineConfig(model=str(model_dir), device=device, execution=ExecutionConfig(enforce_eager=enforce_eager))
    executor = EngineExecutor(config, SCHEDULER, CacheConfig(block_size=16))
    try:
        if device == "cuda" and not enforce_eager and not executor.uses_cuda_graphs:
            pytest.skip(f"attention backend {executor.attention_backend} captures no graphs")
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
    # Capturing the tiny model's few graphs takes tens of ms (34 ms on an H200), so the phase is
    # judged against the same start with graphs off rather than against a fixed time.
    captured = _startup(tiny_qwen3_dir, "cuda")
    eager = _startup(tiny_qwen3_dir, "cuda", enforce_eager=True)
    assert captured["load"] > 0 and captured["kv_cache"] > 0
    assert eager["capture"] < 0.005
    assert captured["capture"] > max(0.01, 3 * eager["capture"])
