"""Dtype handling and the LM head contract: float32 logits for only the rows asked for."""

from __future__ import annotations

import pytest
import torch

from engine.attention import make_metadata, slot_mapping_for
from engine.loader import load_model


def _prefill_hidden(model, ids: list[int], device="cpu"):
    caches = model.make_kv_caches(8, 4)
    table = list(range(-(-len(ids) // 4)))
    meta = make_metadata([len(ids)], [len(ids)], [table], slot_mapping_for(table, 0, len(ids), 4), device)
    with torch.no_grad():
        return model(torch.tensor(ids, device=device), torch.arange(len(ids), device=device), caches, meta)


IDS = [3, 14, 15, 92, 65, 35, 89, 79, 32]


def test_bfloat16_override_gives_bf16_weights_and_float32_logits(tiny_qwen3_dir):
    ref_model, _ = load_model(tiny_qwen3_dir)
    model, _ = load_model(tiny_qwen3_dir, dtype="bfloat16")
    assert ref_model.lm_head.weight.dtype == torch.float32  # the checkpoint's own dtype
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.make_kv_caches(2, 4)[0][0].dtype == torch.bfloat16
    hidden = _prefill_hidden(model, IDS)
    assert hidden.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model.compute_logits(hidden[[2, 8]])
        want = ref_model.compute_logits(_prefill_hidden(ref_model, IDS)[[2, 8]])
    assert logits.shape == (2, model.shape.vocab_size) and logits.dtype == torch.float32
    # bf16 keeps ~3 significant digits; a wrong row or position would be off by the logit scale
    torch.testing.assert_close(logits, want, rtol=0, atol=0.05 * float(want.abs().max()))


def test_compute_logits_only_for_given_rows(tiny_llama_dir):
    model, _ = load_model(tiny_llama_dir)
    hidden = _prefill_hidden(model, IDS)
    with torch.no_grad():
        every = model.compute_logits(hidden)
        last = model.compute_logits(hidden[-1:])
    assert every.shape == (len(IDS), model.shape.vocab_size)
    torch.testing.assert_close(last, every[-1:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_torch_backend_matches_cpu(tiny_qwen3_dir):
    cpu, _ = load_model(tiny_qwen3_dir)
    gpu, _ = load_model(tiny_qwen3_dir, dtype="bfloat16", device="cuda", attention_backend="torch")
    with torch.no_grad():
        want = cpu.compute_logits(_prefill_hidden(cpu, IDS))
        got = gpu.compute_logits(_prefill_hidden(gpu, IDS, "cuda")).cpu()
    torch.testing.assert_close(got, want, rtol=0, atol=0.05 * float(want.abs().max()))
