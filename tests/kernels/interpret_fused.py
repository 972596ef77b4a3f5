"""The fused kernels run by Triton's interpreter on CPU float32 tensors: the kernel checks of
fused_cases, the model with the real kernels wired in (against its torch path), the sampler's
kernel path held to the CPU sampler's properties, and the decode attention kernel's work split.

Not collected by default (the file name does not start with test_): test_fused_interpreter.py
runs it in a subprocess with TRITON_INTERPRET=1, which Triton reads when a kernel is decorated,
i.e. before kernels/ is first imported. Directly:

    TRITON_INTERPRET=1 python -m pytest tests/kernels/interpret_fused.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.kernels import fused_cases as cases
from tests.kernels.interpreter_compat import one_element_indices
from tests.kernels.paged_batch import fresh_seed

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # -inf * 0 in greedy rows, discarded by tl.where
]
F32 = torch.float32


@pytest.fixture(autouse=True, scope="module")
def loop_bounds_computed_at_run_time():
    """Loops over run-time bounds (the decode kernel's key tiles) under numpy 2.4: interpreter_compat."""
    with one_element_indices():
        yield

@pytest.mark.parametrize("hidden", [100, 1024, 2560, 4096])
def test_norms(hidden):
    cases.check_rms_norm("cpu", F32, 5, hidden, fresh_seed())
    cases.check_add_rms_norm("cpu", F32, 3, hidden, fresh_seed())
    cases.check_add_rms_norm("cpu", F32, 3, hidden, fresh_seed(), terms=4)


@pytest.mark.parametrize("heads, head_dim", [(16, 128), (3, 64)])
def test_per_head_norm(heads, head_dim):
    cases.check_per_head_rms_norm("cpu", F32, 4, heads, head_dim, fresh_seed())


@pytest.mark.parametrize("inter", [17, 1000, 3072])
def test_silu_and_mul(inter):
    cases.check_silu_and_mul("cpu", F32, 3, inter, fresh_seed())


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(16, 8, 128), (14, 2, 64), (5, 5, 64)])
@pytest.mark.parametrize("with_norm", [True, False])
def test_qk_norm_rope(heads, kv_heads, head_dim, with_norm):
    cases.check_qk_norm_rope("cpu", F32, 6, heads, kv_heads, head_dim, with_norm, fresh_seed())


@pytest.mark.parametrize("rows, vocab", [(2, 1000), (9, 3001), (24, 5000)])
@pytest.mark.parametrize("with_cutoff", [False, True])
def test_gumbel_argmax(rows, vocab, with_cutoff):
    cases.check_gumbel_argmax("cpu", rows, vocab, with_cutoff, fresh_seed())


# ---- the model with the real kernels ------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-qwen2", "tiny-llama"])
def test_model_with_fused_kernels_matches_torch_path(preset, tmp_path):
    from engine.checkpoint import write_checkpoint
    from engine.loader import load_model
    from tests.engine.fused_model_checks import count_calls, prefill_then_decode

    model, _ = load_model(write_checkpoint(preset, tmp_path / preset, seed=0), dtype="float32")
    expected = prefill_then_decode(model, "cpu")
    assert model.set_fused_kernels("triton", allow_cpu=True) > 0
    calls = count_calls(model)
    got = prefill_then_decode(model, "cpu")
    assert calls["qk_norm_rope_"] == calls["silu_and_mul"] == 2 * model.shape.num_layers
    for ours, ref in zip(got, expected):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


# ---- mixture of experts: the router kernel, the layer from its logits, the model -----------------


@pytest.mark.parametrize("tokens, experts, top_k, block_m, renormalize", [(5, 8, 2, 16, True), (37, 128, 8, 16, False),
                                                                         (20, 60, 6, 32, True), (0, 8, 2, 16, True)])
@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
def test_moe_route_align(tokens, experts, top_k, block_m, renormalize, dtype):
    from tests.kernels import moe_cases

    moe_cases.check_route_align("cpu", dtype, tokens, experts, top_k, block_m, renormalize, fresh_seed())


def test_moe_route_align_with_the_scan_kernel(monkeypatch):
    """Past SMALL_PROGRAMS chunks the alignment scans the count table once (prefill sizes)."""
    import kernels.moe_align_triton as align
    from tests.kernels import moe_cases

    monkeypatch.setattr(align, "SMALL_PROGRAMS", 2)
    moe_cases.check_route_align("cpu", F32, 40, 16, 4, 16, True, fresh_seed())


@pytest.mark.parametrize("summed", [True, False])
def test_fused_moe_routed(summed):
    from kernels.moe_configs import MoeTiles
    from tests.kernels import moe_cases

    moe_cases.check_fused_moe_routed("cpu", F32, 9, 16, 4, 64, 32, True, summed, fresh_seed(), tiles=MoeTiles(16))


def test_moe_model_with_fused_kernels_matches_torch_path_and_counts_alike(tmp_path):
    """tiny-qwen3-moe: the router kernel, the fused experts and the top-k sum taken by the next
    norm, against the torch path; the expert counter records the same choices on both."""
    from engine.checkpoint import write_checkpoint
    from engine.layers.moe import attach_expert_counter
    from engine.loader import load_model
    from tests.engine.fused_model_checks import prefill_then_decode

    model, _ = load_model(write_checkpoint("tiny-qwen3-moe", tmp_path / "moe", seed=0), dtype="float32")
    counter = attach_expert_counter(model, "cpu")
    expected = prefill_then_decode(model, "cpu", lens=(5, 40, 3))
    torch_counts = counter.take()
    assert model.set_fused_kernels("triton", allow_cpu=True) > 0
    got = prefill_then_decode(model, "cpu", lens=(5, 40, 3))
    for ours, ref in zip(got, expected):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
    kernel_counts = counter.take()
    assert kernel_counts.layers == torch_counts.layers == (1, 2)
    assert (kernel_counts.tokens == torch_counts.tokens).all()
    assert (torch_counts.tokens.sum(axis=1) == (48 + 3) * model.shape.num_experts_per_tok).all()


# ---- the sampler's kernel path ------------------------------------------------------------


def _kernel_sampler(seed: int):
    from engine.sampler import Sampler

    sampler = Sampler(seed, "cpu", "triton", allow_cpu_kernels=True)
    assert sampler.uses_kernel
    return sampler


@pytest.mark.parametrize("check", ["greedy_beside_random", "seeded_independent_of_batch",
                                   "unseeded_follow_engine_seed", "top_k_top_p_allowed"])
def test_sampler_kernel_path(check):
    from tests.engine import sampler_checks

    getattr(sampler_checks, f"check_{check}")(_kernel_sampler, "cpu")


def test_sampler_kernel_path_distributions():
    from tests.engine import sampler_checks

    sampler_checks.check_temperature_frequencies(_kernel_sampler, "cpu", n=600)
    sampler_checks.check_top_k_keeps_the_k_best(_kernel_sampler, "cpu", n=300)


def test_sampler_kernel_path_matches_torch_path_for_seeded_rows():
    from engine.sampler import Sampler
    from tests.engine import sampler_checks

    sampler_checks.check_seeded_rows_match(_kernel_sampler, lambda seed: Sampler(seed), "cpu")


@pytest.mark.parametrize("world", [2, 3])
def test_vocabulary_slices_draw_the_kernel_token_of_the_whole_vocabulary(world):
    # 20,000 entries: several CHUNK-wide pieces per slice, the last slice shorter; quantised
    # logits tie often, so the lowest-index rule across slices is exercised too
    from engine.core.sampling_params import SamplingParams
    from tests.engine.test_sharded_sampling import sample_sharded

    gen = torch.Generator().manual_seed(fresh_seed())
    vocab, rows = 20_000, 6
    weight = torch.randint(-2, 3, (vocab, 8), generator=gen).float() / 4
    hidden = torch.randn(rows, 8, generator=gen).round()
    params = [SamplingParams(temperature=t, seed=s) for t, s in
              zip([0.0, 0.6, 1.0, 0.0, 1.3, 0.9], [None, 4, None, None, 11, None])]
    indices = list(range(rows))
    want = _kernel_sampler(7).sample(hidden @ weight.T, params, indices)
    draw = _kernel_sampler(7).shard_draw(params, indices, vocab)
    for got in sample_sharded(hidden, weight, draw, world, kernel=True):
        assert torch.equal(got, want)


# ---- the decode attention kernel's work split -----------------------------------------------


@pytest.mark.parametrize("splits", [None, 1, 3, 8])
def test_decode_attention_with_balanced_chunks(splits, monkeypatch):
    """Every chunk rule walks every key once (kernels.decode_split): sequences a single program
    covers are written directly, others merged, unused programs return, padding rows give zeros."""
    import numpy as np

    from kernels import decode_attention
    from kernels.decode_split import balanced_chunk
    from kernels.reference import decode_attention_ref
    from tests.kernels.paged_batch import make_paged_batch

    seed = fresh_seed()
    lens = [1, 15, 64, 65, 100, 300, 513, 0]
    b = make_paged_batch(lens, [min(1, n) for n in lens], num_heads=4, num_kv_heads=2, head_dim=32,
                         block_size=16, dtype=F32, seed=seed, device="cpu")
    q = torch.randn(len(lens), 4, 32, generator=torch.Generator().manual_seed(seed))
    ref = decode_attention_ref(q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, 32**-0.5)
    monkeypatch.setattr(decode_attention, "_num_sms", lambda index: 4)  # splits follow the SM count; no GPU here
    arrivals = torch.zeros(len(lens) * 2, dtype=torch.int32)  # kept across calls, as a backend keeps it
    for i, chunk in enumerate((None, 0, 64, 128, balanced_chunk(np.array(lens), 2, 4), 4096)):
        out = decode_attention.paged_decode_attention(
            q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, 32**-0.5, num_splits=splits,
            split_chunk=None if chunk is None else torch.tensor([chunk], dtype=torch.int32),
            arrivals=arrivals if i % 2 else None)
        assert not arrivals.any(), (seed, chunk, arrivals)  # the last program of each split resets its counter
        assert torch.equal(out[-1], torch.zeros_like(out[-1])), (seed, chunk)
        torch.testing.assert_close(out[:-1], ref[:-1], rtol=1e-4, atol=1e-4, msg=f"seed {seed}, chunk {chunk}")


@pytest.mark.parametrize("tokens", [3, 20])
def test_qk_norm_rope_store(tokens):
    cases.check_qk_norm_rope_store("cpu", F32, F32, tokens, fresh_seed())
