"""Differential tests: our paged model against Hugging Face transformers on the same checkpoint.

HF runs each sequence whole (no cache tricks); ours runs batches through the paged KV cache with
block size 4, so prompts span several blocks and end in partial ones. Every logit we produce must
equal HF's logit for the same position to 1e-4 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.attention import make_metadata, slot_mapping_for
from engine.loader import load_model

BLOCK_SIZE = 4
PRESETS = ["tiny_qwen3_dir", "tiny_qwen2_dir", "tiny_llama_dir", "tiny_qwen3_moe_dir", "hf_qwen3_moe_dir"]


class PagedRun:
    """A minimal stand-in for the runner: block tables, slots, metadata, one forward per step."""

    def __init__(self, model, num_blocks: int = 64):
        self.model = model
        self.caches = model.make_kv_caches(num_blocks, BLOCK_SIZE)
        self.free = list(range(num_blocks))[::-1]
        self.tables: dict[str, list[int]] = {}

    def share_prefix(self, seq: str, source: str, num_blocks: int) -> None:
        self.tables[seq] = list(self.tables[source][:num_blocks])

    def step(self, chunks: list[tuple[str, list[int], int]]) -> list[torch.Tensor]:
        """chunks: (seq, token ids, position of the first) -> logits [len(ids), vocab] per chunk."""
        slots, ids, positions = [], [], []
        for seq, toks, start in chunks:
            table = self.tables.setdefault(seq, [])
            while len(table) * BLOCK_SIZE < start + len(toks):
                table.append(self.free.pop())
            slots.append(slot_mapping_for(table, start, start + len(toks), BLOCK_SIZE))
            ids += toks
            positions += range(start, start + len(toks))
        meta = make_metadata(
            [len(t) for _, t, _ in chunks],
            [start + len(t) for _, t, start in chunks],
            [self.tables[s] for s, _, _ in chunks],
            np.concatenate(slots),
        )
        with torch.no_grad():
            hidden = self.model(torch.tensor(ids), torch.tensor(positions), self.caches, meta)
            logits = self.model.compute_logits(hidden)
        return list(logits.split([len(t) for _, t, _ in chunks]))


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


@pytest.fixture(scope="module", params=PRESETS)
def pair(request):
    """(our model, HF reference logits function) for one tiny checkpoint, float32."""
    model_dir = request.getfixturevalue(request.param)
    ours, _ = load_model(model_dir, dtype="float32", attention_backend="torch")
    hf, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    # HF must find exactly its own tensors, or it would fill gaps with its own init and the
    # comparison would test the writer against itself.
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    hf.eval()

    def reference(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0].float()  # [len, vocab]

    return ours, reference, hf


def _sequences(lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 500, (n,), generator=gen).tolist() for n in lengths]


def test_batched_prefill_matches_hf(pair):
    ours, reference, _ = pair
    prompts = _sequences([5, 11, 17, 1, 8])
    run = PagedRun(ours)
    logits = run.step([(f"s{i}", p, 0) for i, p in enumerate(prompts)])
    for got, p in zip(logits, prompts):
        assert_logits_close(got, reference(p))


def test_decode_steps_match_hf_at_every_position(pair):
    ours, reference, _ = pair
    full = _sequences([12, 15, 9], seed=1)
    prompt_lens = [3, 8, 5]
    run = PagedRun(ours)
    refs = [reference(s) for s in full]
    got = run.step([(f"s{i}", s[:n], 0) for i, (s, n) in enumerate(zip(full, prompt_lens))])
    for i, n in enumerate(prompt_lens):
        assert_logits_close(got[i], refs[i][:n])
    # teacher-forced decode: one token per live sequence per step, until each is exhausted
    pos = list(prompt_lens)
    while any(p < len(s) for p, s in zip(pos, full)):
        live = [i for i in range(len(full)) if pos[i] < len(full[i])]
        got = run.step([(f"s{i}", [full[i][pos[i]]], pos[i]) for i in live])
        for i, g in zip(live, got):
            assert_logits_close(g, refs[i][pos[i] : pos[i] + 1])
            pos[i] += 1


def test_chunked_prefill_matches_hf(pair):
    ours, reference, _ = pair
    full = _sequences([14, 9, 19], seed=2)
    chunk = [3, 5, 4]  # chunk ends fall inside and on block boundaries
    run = PagedRun(ours)
    refs = [reference(s) for s in full]
    pos = [0, 0, 0]
    while any(p < len(s) for p, s in zip(pos, full)):
        live = [i for i in range(len(full)) if pos[i] < len(full[i])]
        spans = {i: (pos[i], min(pos[i] + chunk[i], len(full[i]))) for i in live}
        got = run.step([(f"s{i}", full[i][a:b], a) for i, (a, b) in spans.items()])
        for i, g in zip(live, got):
            a, b = spans[i]
            assert_logits_close(g, refs[i][a:b])
            pos[i] = b


def test_shared_prefix_blocks_are_reused_not_recomputed(pair):
    ours, reference, _ = pair
    prefix, tail_a, tail_b = _sequences([10, 4, 6], seed=3)
    seq_a, seq_b = prefix + tail_a, prefix + tail_b
    run = PagedRun(ours)
    run.step([("a", seq_a, 0)])
    # B reuses A's two full blocks (positions 0..7) and computes only from position 8 on,
    # in the same step as a decode of A.
    shared = 8 // BLOCK_SIZE
    run.share_prefix("b", "a", shared)
    snapshot = [(k[run.tables["a"][:shared]].clone(), v[run.tables["a"][:shared]].clone()) for k, v in run.caches]
    extra = _sequences([1], seed=4)[0]
    got_a, got_b = run.step([("a", extra, len(seq_a)), ("b", seq_b[8:], 8)])
    assert run.tables["b"][:shared] == run.tables["a"][:shared]
    assert not set(run.tables["b"][shared:]) & set(run.tables["a"])
    assert_logits_close(got_b, reference(seq_b)[8:])
    assert_logits_close(got_a, reference(seq_a + extra)[-1:])
    for (k, v), (k0, v0) in zip(run.caches, snapshot):
        assert torch.equal(k[run.tables["a"][:shared]], k0) and torch.equal(v[run.tables["a"][:shared]], v0)


def test_greedy_tokens_match_hf_generate(pair):
    ours, _, hf = pair
    prompts = _sequences([4, 9, 6], seed=5)
    run = PagedRun(ours)
    outs = [[] for _ in prompts]
    logits = run.step([(f"s{i}", p, 0) for i, p in enumerate(prompts)])
    for step in range(8):
        for i, lg in enumerate(logits):
            outs[i].append(int(lg[-1].argmax()))
        logits = run.step([(f"s{i}", [o[-1]], len(p) + step) for i, (p, o) in enumerate(zip(prompts, outs))])
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, eos_token_id=None)
        assert o == want[0, len(p) :].tolist()
