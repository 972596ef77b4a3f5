"""EngineConfig.fused_kernels and the layers' fused path.

On CPU: the flag is validated, "triton" keeps the torch path on a CPU device, and the model's
call sites (in-place q/k rotation in the qkv buffer, the residual stream through fused add+norm,
the first layer's plain norm, SiLU-and-mul) give the torch path's logits when the kernels are
replaced by float32 torch stand-ins. On CUDA (-m gpu): the real Triton kernels in the Qwen3-0.6B
shape against the torch path, eagerly and through CUDA-graph replay.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from engine.layers.fused import UsesFusedKernels, set_fused_kernels
from engine.loader import load_model
from tests.engine.fused_model_checks import count_calls, prefill_then_decode, reference_kernels

PRESETS = ["tiny_qwen3_dir", "tiny_qwen2_dir", "tiny_llama_dir"]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_engine_config_validates_fused_kernels():
    assert EngineConfig(model="m").fused_kernels == "triton"
    assert EngineConfig(model="m", fused_kernels="triton").fused_kernels == "triton"
    with pytest.raises(ValueError, match="fused_kernels"):
        EngineConfig(model="m", fused_kernels="on")


def test_triton_mode_keeps_the_torch_path_on_cpu(tiny_qwen3_dir):
    model, _ = load_model(tiny_qwen3_dir, dtype="float32")
    assert model.set_fused_kernels("triton") == 0
    assert all(m.fused_kernels is None for m in model.modules() if isinstance(m, UsesFusedKernels))
    with pytest.raises(ValueError, match="fused_kernels must be one of"):
        set_fused_kernels(model, "fast", "cpu")


@pytest.mark.parametrize("preset", PRESETS)
def test_fused_call_sites_give_the_torch_path_logits(preset, request):
    model, _ = load_model(request.getfixturevalue(preset), dtype="float32")
    expected = prefill_then_decode(model, "cpu")
    stand_in = reference_kernels()
    for m in model.modules():
        if isinstance(m, UsesFusedKernels):
            m.fused_kernels = stand_in
    calls = count_calls(model)
    got = prefill_then_decode(model, "cpu")
    layers = model.shape.num_layers
    # per forward: q/k + rotary and SiLU once a layer; the first input norm alone has no residual;
    # every other norm (input norms after layer 0, post-attention norms, the final norm) adds one
    assert calls == {"qk_norm_rope_": 2 * layers, "silu_and_mul": 2 * layers, "rms_norm": 2,
                     "add_rms_norm": 2 * (2 * layers)}, calls
    for ours, ref in zip(got, expected):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


# ---- CUDA: the real kernels ------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_0_6b_dir(tmp_path_factory):
    from engine.checkpoint import write_checkpoint

    return write_checkpoint("qwen3-0.6b", tmp_path_factory.mktemp("qwen3-0.6b"), dtype="bfloat16")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("attention_backend", ["triton", "torch"])
def test_fused_model_matches_torch_path_on_cuda(qwen3_0_6b_dir, attention_backend):
    model, _ = load_model(qwen3_0_6b_dir, device="cuda", attention_backend=attention_backend)
    # 16-token blocks; prompts spanning several, one ending on a block boundary
    shape = dict(block_size=16, lens=(37, 5, 64, 100, 1))
    expected = prefill_then_decode(model, "cuda", **shape)
    assert model.set_fused_kernels("triton") > 0
    calls = count_calls(model)
    got = prefill_then_decode(model, "cuda", **shape)
    assert calls["qk_norm_rope_"] == 2 * model.shape.num_layers
    for step, (ours, ref) in enumerate(zip(got, expected)):
        # bf16 through 28 layers, rounded once per fused op instead of once per torch op
        # (a wiring bug, e.g. an unrotated k or a lost residual, is an O(1) error)
        assert _rel(ours, ref) < 3e-2, (step, _rel(ours, ref))


@pytest.mark.gpu
@needs_cuda
def test_fused_graph_replay_matches_fused_eager_on_cuda(qwen3_0_6b_dir):
    from engine.core.config import CacheConfig, SchedulerConfig
    from engine.core.graph_sizes import decode_graph_sizes
    from engine.rank import build_runner
    from tests.engine.test_cuda_graph import _graph_vs_eager

    sched = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=768)
    cache = CacheConfig(block_size=256, num_blocks=64 * 3 + 8)
    config = EngineConfig(model=str(qwen3_0_6b_dir), fused_kernels="triton", attention_backend="triton")
    runner = build_runner(config, sched, cache, torch.device("cuda"))
    assert runner.sampler.uses_kernel
    assert all(m.fused_kernels is not None for m in runner.model.modules() if isinstance(m, UsesFusedKernels))
    runner.allocate_kv_cache(cache.num_blocks)
    runner.capture_decode_graphs()
    assert set(runner.graphs.graphs) == set(decode_graph_sizes(64, 512))
    for n in sorted({1, 5, 17, 64, *np.random.default_rng(1).integers(1, 65, 4).tolist()}):
        eager, replayed, (eager_rows, eager_changed), (graph_rows, graph_changed), slots = _graph_vs_eager(runner, n, n)
        assert _rel(replayed, eager) < 3e-2, (n, _rel(replayed, eager))
        assert graph_changed == eager_changed == slots, n  # padded rows wrote nothing
        assert _rel(graph_rows, eager_rows) < 3e-2, n

