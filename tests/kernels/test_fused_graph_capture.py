"""The fused elementwise kernels inside a CUDA graph: one decoder-layer-shaped chain (add+norm,
q/k norm + rotary in place, SiLU-and-mul, plain norm) is captured once, then replayed over new
values written into its static inputs; each replay must equal the same chain run eagerly."""

from __future__ import annotations

import torch

from tests.kernels.fused_cases import rope_tables
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda


def _chain(x, residual, qkv, cos, sin, gate_up, w, qw, kw, heads, kv_heads, head_dim):
    from kernels.activation import silu_and_mul
    from kernels.rmsnorm import add_rms_norm, rms_norm
    from kernels.rotary import qk_norm_rope_

    normed, new_residual = add_rms_norm(x, residual, w, 1e-6)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    q = qkv[:, :q_size].view(-1, heads, head_dim)
    k = qkv[:, q_size: q_size + kv_size].view(-1, kv_heads, head_dim)
    qk_norm_rope_(q, k, cos, sin, qw, kw, 1e-6)
    return rms_norm(normed, w, 1e-6), new_residual, silu_and_mul(gate_up), qkv


def test_fused_kernels_replay_in_a_cuda_graph():
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    tokens, hidden, heads, kv_heads, head_dim, inter = 48, 1024, 16, 8, 128, 3072
    bf16 = dict(device="cuda", dtype=torch.bfloat16)

    def fresh():
        qkv_width = (heads + 2 * kv_heads) * head_dim
        cos, sin = rope_tables(torch.randint(0, 4096, (tokens,), generator=gen), head_dim)
        return [torch.randn(tokens, hidden, generator=gen).to(**bf16),
                torch.randn(tokens, hidden, generator=gen).to(**bf16),
                torch.randn(tokens, qkv_width, generator=gen).to(**bf16), cos.cuda(), sin.cuda(),
                torch.randn(tokens, 2 * inter, generator=gen).to(**bf16)]

    weights = [(torch.rand(n, generator=gen) + 0.5).to(**bf16) for n in (hidden, head_dim, head_dim)]
    static = fresh()
    _chain(*[t.clone() for t in static], *weights, heads, kv_heads, head_dim)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = _chain(*static, *weights, heads, kv_heads, head_dim)
    for _ in range(3):
        inputs = fresh()
        for buf, value in zip(static, inputs):
            buf.copy_(value)
        graph.replay()
        expected = _chain(*[t.clone() for t in inputs], *weights, heads, kv_heads, head_dim)
        for got, want in zip(outputs, expected):
            assert torch.equal(got, want), f"graph replay differs from eager (seed {seed})"
