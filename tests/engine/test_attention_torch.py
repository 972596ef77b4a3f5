"""The torch paged-attention backend against a naive float64 dense reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.attention import ATTENTION_BACKENDS, get_attention_backend, make_metadata, slot_mapping_for
from engine.attention.torch_backend import TorchAttentionBackend

BLOCK_SIZE = 4
NUM_BLOCKS = 40


def _dense_reference(q, keys, values, seq_len, scale):
    """q [q_len, H, D]; keys/values [seq_len, Hkv, D] (the whole sequence) in float64."""
    q_len, num_heads, _ = q.shape
    group = num_heads // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for j in range(q_len):
        pos = seq_len - q_len + j
        for h in range(num_heads):
            kv_h = h // group
            scores = (keys[: pos + 1, kv_h].double() @ q[j, h].double()) * scale
            out[j, h] = torch.softmax(scores, 0) @ values[: pos + 1, kv_h].double()
    return out


def _random_batch(seed: int, num_heads: int, num_kv_heads: int, head_dim: int, num_padding: int):
    """Ragged (seq_len, query_len) pairs around block boundaries, blocks shuffled across sequences."""
    rng = np.random.default_rng(seed)
    shapes = [(1, 1), (4, 4), (5, 2), (8, 1), (9, 9), (13, 3), (16, 5)]
    shapes += [(int(s), int(rng.integers(1, s + 1))) for s in rng.integers(1, 20, size=3)]
    rng.shuffle(shapes)
    free = list(rng.permutation(NUM_BLOCKS))
    seqs = []
    for seq_len, q_len in shapes:
        table = [int(free.pop()) for _ in range(math.ceil(seq_len / BLOCK_SIZE))]
        keys = torch.randn(seq_len, num_kv_heads, head_dim)
        values = torch.randn(seq_len, num_kv_heads, head_dim)
        q = torch.randn(q_len, num_heads, head_dim)
        seqs.append(dict(seq_len=seq_len, q_len=q_len, table=table, keys=keys, values=values, q=q))
    # Unused slots hold NaN, as an uninitialised cache might: they must neither be read nor written.
    k_cache = torch.full((NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim), float("nan"))
    v_cache = k_cache.clone()
    for s in seqs:  # the context already in cache before this step
        old = s["seq_len"] - s["q_len"]
        slots = torch.from_numpy(slot_mapping_for(s["table"], 0, old, BLOCK_SIZE))
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = s["keys"][:old]
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = s["values"][:old]
    slot_mapping = np.concatenate(
        [slot_mapping_for(s["table"], s["seq_len"] - s["q_len"], s["seq_len"], BLOCK_SIZE) for s in seqs]
        + [np.full(num_padding, -1, dtype=np.int64)]
    )
    meta = make_metadata(
        [s["q_len"] for s in seqs], [s["seq_len"] for s in seqs], [s["table"] for s in seqs], slot_mapping
    )
    pad = lambda *shape: torch.randn(num_padding, *shape)  # noqa: E731
    q = torch.cat([s["q"] for s in seqs] + [pad(num_heads, head_dim)])
    k = torch.cat([s["keys"][s["seq_len"] - s["q_len"] :] for s in seqs] + [pad(num_kv_heads, head_dim)])
    v = torch.cat([s["values"][s["seq_len"] - s["q_len"] :] for s in seqs] + [pad(num_kv_heads, head_dim)])
    return seqs, q, k, v, k_cache, v_cache, meta


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("num_padding", [0, 3])
def test_matches_dense_float64_reference(seed, num_heads, num_kv_heads, num_padding):
    torch.manual_seed(seed)
    head_dim = 8
    scale = head_dim**-0.5
    seqs, q, k, v, k_cache, v_cache, meta = _random_batch(seed, num_heads, num_kv_heads, head_dim, num_padding)
    out = TorchAttentionBackend().forward(q, k, v, k_cache, v_cache, meta, scale)
    assert out.shape == q.shape
    start = 0
    for s in seqs:
        got = out[start : start + s["q_len"]]
        want = _dense_reference(s["q"], s["keys"], s["values"], s["seq_len"], scale)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        start += s["q_len"]


@pytest.mark.parametrize("num_padding", [0, 3])
def test_store_writes_exactly_the_new_slots(num_padding):
    torch.manual_seed(0)
    seqs, q, k, v, k_cache, v_cache, meta = _random_batch(5, 4, 2, 8, num_padding)
    TorchAttentionBackend().forward(q, k, v, k_cache, v_cache, meta, 0.3)
    flat_k, flat_v = k_cache.view(-1, 2, 8), v_cache.view(-1, 2, 8)
    used = torch.zeros(flat_k.shape[0], dtype=torch.bool)
    for s in seqs:
        slots = torch.from_numpy(slot_mapping_for(s["table"], 0, s["seq_len"], BLOCK_SIZE))
        torch.testing.assert_close(flat_k[slots], s["keys"])
        torch.testing.assert_close(flat_v[slots], s["values"])
        used[slots] = True
    # padding tokens (slot -1) and everything else untouched
    assert torch.isnan(flat_k[~used]).all() and torch.isnan(flat_v[~used]).all()


def test_decode_only_batch_over_partial_blocks():
    torch.manual_seed(3)
    head_dim, scale = 16, 0.25
    seq_lens = [1, 4, 5, 12, 15]
    tables = [[i * 4 + b for b in range(math.ceil(n / BLOCK_SIZE))] for i, n in enumerate(seq_lens)]
    keys = [torch.randn(n, 2, head_dim) for n in seq_lens]
    values = [torch.randn(n, 2, head_dim) for n in seq_lens]
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 2, head_dim)
    v_cache = torch.zeros_like(k_cache)
    for t, kk, vv, n in zip(tables, keys, values, seq_lens):
        slots = torch.from_numpy(slot_mapping_for(t, 0, n - 1, BLOCK_SIZE))
        k_cache.view(-1, 2, head_dim)[slots], v_cache.view(-1, 2, head_dim)[slots] = kk[:-1], vv[:-1]
    slots = np.concatenate([slot_mapping_for(t, n - 1, n, BLOCK_SIZE) for t, n in zip(tables, seq_lens)])
    meta = make_metadata([1] * len(seq_lens), seq_lens, tables, slots)
    assert meta.is_decode_only
    q = torch.randn(len(seq_lens), 4, head_dim)
    out = TorchAttentionBackend().forward(
        q, torch.stack([kk[-1] for kk in keys]), torch.stack([vv[-1] for vv in values]), k_cache, v_cache, meta, scale
    )
    for i, n in enumerate(seq_lens):
        want = _dense_reference(q[i : i + 1], keys[i], values[i], n, scale)
        torch.testing.assert_close(out[i : i + 1].double(), want, rtol=1e-5, atol=1e-5)


def test_make_metadata_packs_lists():
    meta = make_metadata([3, 1, 2], [3, 9, 6], [[7], [1, 2, 3], [4, 5]], list(range(6)), block_table_width=4)
    assert meta.query_start_loc.tolist() == [0, 3, 4, 6]
    assert meta.query_start_loc.dtype == torch.int32 and meta.seq_lens.dtype == torch.int32
    assert meta.slot_mapping.dtype == torch.int64 and meta.block_tables.dtype == torch.int32
    assert meta.seq_lens.tolist() == [3, 9, 6]
    assert meta.block_tables.tolist() == [[7, 0, 0, 0], [1, 2, 3, 0], [4, 5, 0, 0]]
    assert (meta.max_query_len, meta.max_seq_len, meta.is_decode_only) == (3, 9, False)


@pytest.mark.parametrize(
    "args,match",
    [
        (([], [], [], []), "must not be empty"),
        (([1, 1], [1], [[0], [1]], [0, 1]), "one entry per sequence"),
        (([2], [1], [[0]], [0, 1]), "query_len"),
        (([2], [2], [[0]], [0]), "slot_mapping"),
    ],
)
def test_make_metadata_rejects_inconsistent_lists(args, match):
    with pytest.raises(ValueError, match=match):
        make_metadata(*args)


def test_slot_mapping_follows_block_table():
    table, bs = [9, 2, 5], 4
    got = slot_mapping_for(table, 3, 10, bs).tolist()
    assert got == [table[p // bs] * bs + p % bs for p in range(3, 10)]


def test_registry():
    assert get_attention_backend("torch").name == "torch"
    assert get_attention_backend("auto", device="cpu").name == "torch"
    assert set(ATTENTION_BACKENDS) == {"auto", "torch", "triton", "flash_attn"}
    with pytest.raises(ValueError, match="attention_backend='nope'.*expected one of"):
        get_attention_backend("nope")


def test_registry_names_the_missing_package():
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    with pytest.raises(ValueError, match="attention_backend='flash_attn'.*flash-attn"):
        get_attention_backend("flash_attn")


def _fake_backends(monkeypatch, problems: dict[str, str | None]):
    from types import SimpleNamespace

    from engine.attention import registry
    from engine.core.registry import Registry

    monkeypatch.setattr(registry, "_problem", lambda name, block_size, dtype: problems.get(name))
    fakes: Registry = Registry("attention_backend")
    fakes.add("torch", registry.ATTENTION.get("torch"))
    for name in ("triton", "flash_attn"):
        fakes.add(name, lambda name=name: SimpleNamespace(name=name))
    monkeypatch.setattr(registry, "ATTENTION", fakes)


def test_auto_routes_phases_when_both_gpu_backends_serve_the_cache(monkeypatch):
    _fake_backends(monkeypatch, {})
    backend = get_attention_backend("auto", device="cuda", block_size=256, dtype=torch.bfloat16)
    assert backend.name == "flash_attn+triton"
    assert (backend.flash.name, backend.triton.name) == ("flash_attn", "triton")
    assert backend.supports_decode_graphs() and backend.supports_prefill_graphs()


@pytest.mark.parametrize("problems, want", [
    ({"flash_attn": "float32"}, "triton"),
    ({"triton": "missing"}, "flash_attn"),
    ({"flash_attn": "missing", "triton": "missing"}, "torch"),
])
def test_auto_passes_over_a_backend_that_cannot_serve_the_cache(monkeypatch, problems, want):
    _fake_backends(monkeypatch, problems)
    assert get_attention_backend("auto", device="cuda", block_size=16, dtype=torch.float32).name == want


def test_explicit_backend_is_refused_with_the_reason(monkeypatch):
    _fake_backends(monkeypatch, {"flash_attn": "FlashAttention-4 computes in float16 or bfloat16 only"})
    with pytest.raises(ValueError, match="attention_backend='flash_attn': FlashAttention-4 computes in float16"):
        get_attention_backend("flash_attn", device="cuda", block_size=16, dtype=torch.float32)
    assert get_attention_backend("triton", device="cuda").name == "triton"


def test_flash_attn_problem_names_dtype_and_page_limits(monkeypatch):
    from engine.attention import flash_attn_backend as fa

    monkeypatch.setattr(fa, "import_fa4", lambda: object())
    assert "float16 or bfloat16" in fa.flash_attn_problem(16, torch.float32)
    assert fa.flash_attn_problem(16, torch.bfloat16) is None  # FA4 pages any block size
    monkeypatch.setattr(fa, "import_fa4", lambda: None)
    monkeypatch.setattr(fa, "import_fa2", lambda: (object(), object()))
    assert "multiple of 256" in fa.flash_attn_problem(16, torch.bfloat16)
    assert fa.flash_attn_problem(512, torch.float32) is None
    monkeypatch.setattr(fa, "import_fa2", lambda: None)
    assert "not installed" in fa.flash_attn_problem(512, torch.bfloat16)


@pytest.mark.parametrize("decode, tiles, tokens, max_q, max_s, want", [
    (True, False, 256, 1, 4096, "triton"),            # decode: Triton's split-KV
    (False, True, 4096, 4096, 12288, "triton"),       # a prefill graph reads a tile map
    (False, False, 15000, 1024, 1024, "triton"),      # many short prompts, no context
    (False, False, 2048, 2048, 8192, "flash_attn"),   # a long prompt's later chunk
    (False, False, 8192, 512, 2560, "flash_attn"),
])
def test_phase_routing_follows_the_measured_crossover(decode, tiles, tokens, max_q, max_s, want):
    from types import SimpleNamespace

    from engine.attention.phases import PhaseRoutedBackend

    backend = PhaseRoutedBackend(SimpleNamespace(name="flash_attn"), SimpleNamespace(name="triton"))
    meta = SimpleNamespace(is_decode_only=decode, tile_seq=object() if tiles else None,
                           max_query_len=max_q, max_seq_len=max_s)
    assert backend.pick(torch.empty(tokens, 16, 1), meta).name == want
