from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from kernels.decode_split import balanced_chunk
from kernels.reference import decode_attention_ref
from sim.decode_programs import GH100_DECODE_PROGRAMS_PER_SM
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed, make_paged_batch, rel_err

pytestmark = needs_cuda


def _boundary_lens(block_size: int, seed: int) -> list[int]:
    """Lengths at and around block edges, a partly filled last block, and ragged random ones."""
    rng = random.Random(seed)
    bs = block_size
    lens = [1, 2, bs - 1, bs, bs + 1, 2 * bs, 3 * bs - 1, 3 * bs + 1, 4 * bs]
    return lens + [rng.randint(1, 12 * bs) for _ in range(3)] + [rng.randint(2000, 3000)]


def _check(out, ref, seq_lens, seed):
    assert not torch.isnan(out).any(), f"NaN in output (seed {seed})"
    for i, s in enumerate(seq_lens):
        if s == 0:
            assert torch.equal(out[i], torch.zeros_like(out[i])), f"padded row {i} not zero"
            continue
        err = rel_err(out[i], ref[i])
        assert err < 1e-2, f"seq {i} (len {s}) rel err {err:.3e} (seed {seed})"


@pytest.mark.parametrize("gqa", [1, 2, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 256])
def test_decode_matches_reference(gqa, head_dim, block_size):
    from kernels.decode_attention import paged_decode_attention

    seed = fresh_seed()
    seq_lens = _boundary_lens(block_size, seed)
    num_kv_heads = 2
    b = make_paged_batch(
        seq_lens, [1] * len(seq_lens), num_heads=gqa * num_kv_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, block_size=block_size, dtype=torch.bfloat16, seed=seed,
    )  # fmt: skip
    scale = head_dim**-0.5
    ref = decode_attention_ref(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, scale)
    # auto split count, no split, and more splits than some sequences have tiles
    for splits in (None, 1, 5, 48):
        out = paged_decode_attention(
            b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, scale,
            max_seq_len_hint=b.max_seq_len, num_splits=splits,
        )  # fmt: skip
        _check(out, ref, seq_lens, f"{seed}, splits {splits}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(16, 8), (32, 8)])  # Qwen3-0.6B / 8B shapes
def test_decode_qwen_shapes_and_padded_rows(dtype, num_heads, num_kv_heads):
    from kernels.decode_attention import paged_decode_attention

    seed = fresh_seed()
    rng = random.Random(seed)
    seq_lens = [rng.randint(1, 1500) for _ in range(24)] + [0, 0]  # two CUDA-graph padding rows
    b = make_paged_batch(
        seq_lens, [min(1, s) for s in seq_lens], num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=128, block_size=256, dtype=dtype, seed=seed,
    )  # fmt: skip
    q = torch.randn(len(seq_lens), num_heads, 128, device="cuda").to(dtype)
    ref = decode_attention_ref(q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, 128**-0.5)
    for splits in (None, 1, 7):
        out = paged_decode_attention(
            q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, 128**-0.5, num_splits=splits
        )
        _check(out, ref, seq_lens, f"{seed}, splits {splits}")
    # balanced chunks (kernels.decode_split): the fair share of this batch, one below the even
    # rule's chunk (ignored), and one that leaves most sequences whole
    fair = balanced_chunk(np.array(seq_lens), num_kv_heads, 132)
    for splits, chunk in ((None, fair), (8, fair), (8, 0), (4, 1024), (16, 64)):
        out = paged_decode_attention(
            q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, 128**-0.5, num_splits=splits,
            split_chunk=torch.tensor([chunk], dtype=torch.int32, device="cuda"),
        )  # fmt: skip
        _check(out, ref, seq_lens, f"{seed}, splits {splits}, chunk {chunk}")


def test_kept_arrival_counters_survive_graph_replays_and_new_lengths():
    """The split programs' arrival counters (one buffer kept by the backend, recorded by a CUDA
    graph) are back at zero after every launch, so replays on new lengths and queries stay right."""
    from kernels.decode_attention import DecodeArrivals, paged_decode_attention

    seed = fresh_seed()
    rng = random.Random(seed)
    num_seqs, num_heads, num_kv_heads = 64, 16, 8
    b = make_paged_batch([4096] * num_seqs, [1] * num_seqs, num_heads=num_heads, num_kv_heads=num_kv_heads,
                         head_dim=128, block_size=256, dtype=torch.bfloat16, seed=seed)
    arrivals = DecodeArrivals(minimum=1)
    q = b.q.clone()
    lens = b.seq_lens.clone()
    chunk = torch.tensor([64], dtype=torch.int32, device="cuda")  # many splits: most sequences merge

    def step():
        return paged_decode_attention(q, b.k_cache, b.v_cache, b.block_tables, lens, 128**-0.5,
                                      max_seq_len_hint=4096, split_chunk=chunk,
                                      arrivals=arrivals.get(num_seqs * num_kv_heads, q.device))

    step()  # eager first: sizes the buffer outside the capture, as engine.graph_capture does
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for replay in range(6):
        new_lens = [rng.randint(1, 4096) for _ in range(num_seqs)]
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        chunk.fill_(rng.choice([64, 256, 1024]))
        graph.replay()
        torch.cuda.synchronize()
        assert not arrivals.get(1, q.device).any(), f"counters left non-zero (seed {seed}, replay {replay})"
        ref = decode_attention_ref(q, b.k_cache, b.v_cache, b.block_tables, lens, 128**-0.5)
        _check(out, ref, new_lens, f"{seed}, replay {replay}")


def test_an_sm_holds_as_many_decode_programs_as_the_simulator_prices():
    """sim.decode_programs prices the waves of a launch from hardware.decode_programs_per_sm: the
    compiled kernel's registers, shared memory and warps give how many programs one SM holds."""
    import kernels.decode_attention as decode

    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor) != (9, 0):
        pytest.skip("conf/hardware's figure is the GH100's (H100, H200)")
    # Qwen3-0.6B's decode launch as the engine makes it: bf16, 16 query heads on 8 KV heads, 128 dims,
    # 256-token pages, a fair share passed
    b = make_paged_batch([1000] * 48, [1] * 48, num_heads=16, num_kv_heads=8, head_dim=128, block_size=256,
                         dtype=torch.bfloat16, seed=fresh_seed())
    decode._decode_split_kernel.device_caches.clear()  # only this launch's variant compiled below
    decode.paged_decode_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, 128**-0.5,
                                  max_seq_len_hint=8192,
                                  split_chunk=torch.tensor([1024], dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    (kernel,) = [k for cache in decode._decode_split_kernel.device_caches.values() for k in cache[0].values()]
    kernel._init_handles()
    warps, regs, smem = kernel.metadata.num_warps, kernel.n_regs, kernel.metadata.shared
    per_warp = -(-regs * 32 // 256) * 256  # registers are handed to warps in units of 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // per_warp // warps
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // (smem + 1024)  # 1 KB kept per block
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
    resident = min(by_regs, by_smem, by_threads, 32)
    figure = GH100_DECODE_PROGRAMS_PER_SM
    assert resident == figure, (f"{props.name}: {regs} registers, {smem} B shared, {warps} warps -> {resident} "
                                f"programs per SM (regs {by_regs}, shared {by_smem}, threads {by_threads}); "
                                f"the simulator's figure is {figure}")
