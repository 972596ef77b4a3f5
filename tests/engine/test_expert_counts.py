"""The engine's routed-token counts (engine.expert_counts) on CPU with the tiny MoE model: equal to
the routing a hook on every router sees, real tokens only, zero after take(), off by default and
absent for a dense model; the harness writes them and the simulator's skew fit reads them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from engine import LLM, SamplingParams
from engine.expert_counts import ExpertCounter, add_counts
from engine.layers.moe import SparseMoE
from kernels.moe_reference import route
from sim.moe import fit_routing_skew, read_routing_counts

PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def _llm(**kwargs) -> LLM:
    return LLM("tiny-qwen3-moe", load_format="dummy", device="cpu", max_model_len=64, **kwargs)


def test_counts_equal_the_routing_the_routers_computed():
    llm = _llm(record_expert_counts=True)
    model = llm.executor.runner.model
    llm.executor.take_expert_counts()  # whatever start-up routed
    sparse = [(i, layer.mlp) for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, SparseMoE)]
    seen = {i: [] for i, _ in sparse}
    hooks = [moe.gate.register_forward_hook(lambda m, a, out, i=i: seen[i].append(out.detach().clone()))
             for i, moe in sparse]
    rng = np.random.default_rng(int(torch.randint(0, 2**31 - 1, ()).item()))
    prompts = [rng.integers(0, 500, size=n).tolist() for n in (7, 19, 3, 30)]
    llm.generate(prompts, PARAMS, use_tqdm=False)
    for hook in hooks:
        hook.remove()
    counts = llm.executor.take_expert_counts()
    shape = model.shape
    assert counts.layers == tuple(i for i, _ in sparse) == (1, 2)
    assert counts.tokens.shape == (2, shape.num_experts)
    for row, (i, moe) in enumerate(sparse):
        _, ids = route(torch.cat(seen[i]), moe.top_k, moe.renormalize)
        assert (counts.tokens[row] == torch.bincount(ids.reshape(-1), minlength=shape.num_experts).numpy()).all()
    forwarded = sum(len(p) + PARAMS.max_tokens - 1 for p in prompts)  # the last token is never fed back
    assert (counts.tokens.sum(axis=1) == forwarded * shape.num_experts_per_tok).all()
    assert llm.executor.take_expert_counts().tokens.sum() == 0  # take() starts again from zero
    llm.shutdown()


def test_off_by_default_and_none_for_a_dense_model():
    assert _llm().executor.take_expert_counts() is None
    dense = LLM("tiny-qwen3", load_format="dummy", device="cpu", max_model_len=64, record_expert_counts=True)
    assert dense.executor.take_expert_counts() is None
    with pytest.raises(TypeError, match="record_expert_counts must be a bool"):
        _llm(record_expert_counts="yes")


def test_padding_rows_are_not_counted():
    counter = ExpertCounter([3], 6, "cpu")
    counter.valid = torch.tensor([4, -1, 0, -1])  # a graph's padding rows have slot -1
    add_counts(counter.record(0), torch.tensor([[0, 5], [1, 2], [5, 3], [4, 4]]))
    counts = counter.take()
    assert counts.layers == (3,) and counts.tokens.tolist() == [[1, 0, 0, 1, 0, 2]]
    assert counter.take().tokens.sum() == 0


def test_a_run_folder_holds_the_counts_and_the_sim_fits_them(tmp_path):
    from harness.config import build_run_config
    from harness.run import run_once, write_outcome
    from tests.harness.conftest import compose_config

    rc = build_run_config(compose_config([
        "backend=engine", "model=tiny-qwen3-moe", "backend.load_format=dummy", "backend.device=cpu",
        "backend.record_expert_counts=true", "workload.num_requests=4", "scheduler.max_model_len=256"]))
    outcome = run_once(rc, progress=False)
    write_outcome(outcome, tmp_path, plots=False)
    table = pd.read_csv(tmp_path / "expert_counts.csv")
    assert list(table.columns) == ["layer", "expert", "tokens"]
    counts = read_routing_counts(tmp_path / "expert_counts.csv")
    r = outcome.requests  # every token the model ran forward: the last output is never fed back
    forwarded = int((r.prompt_tokens - r.cached_tokens + r.recomputed_tokens + r.output_tokens - 1).sum())
    assert counts.shape == (2, 8) and (counts.sum(axis=1) == forwarded * 2).all()
    skew = fit_routing_skew(counts, 2)
    assert 0.0 <= skew <= 8.0
    from experiments.moe.fit_skew import main as fit_skew

    result = fit_skew([str(tmp_path / "expert_counts.csv"), "--top-k", "2"])
    assert (tmp_path / "skew.json").is_file() and result["skew"] == skew and result["layers"] == 2
    assert result["distinct_experts"]["1"]["uniform"] == pytest.approx(2.0)
