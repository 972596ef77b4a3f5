"""The profiling grid's per-step distinct experts (harness.calibration.expert_steps) on CPU with the
tiny MoE model and random weights: each row's count equals the distinct experts of the top-k that
hooks on the routers saw for that shape's executions, and the tally's sum equals the counter's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine import LLM
from engine.layers.moe import SparseMoE
from harness.calibration.expert_steps import ExpertTally, distinct_per_layer
from harness.calibration.profiling import ProfileGrid, profile_executor
from kernels.moe_reference import route

# a few shapes of each kind, shared prefixes among them (few experts: they route alike)
GRID = dataclasses.replace(
    ProfileGrid.quick(), prefill_tokens=(16, 64), prefill_seqs=(1, 4), prefill_contexts=(0,), decode_batches=(1, 16),
    decode_contexts=(32,), eager_decode_batches=(), mixed_prefill_tokens=(32,), long_prefill_tokens=(),
    num_random=3, shared_prefix_tokens=(64,), shared_prefix_groups=(1,), shared_decode_batches=(8,),
    shared_prefill_tokens=(), shared_mixed_prefill_tokens=(), num_random_shared=1, repeats=2, min_repeats=1)


def test_each_row_holds_the_experts_its_step_touched():
    llm = LLM("tiny-qwen3-moe", load_format="dummy", device="cpu", max_model_len=256, record_expert_counts=True,
              seed=int(torch.randint(0, 2**31 - 1, ()).item()))
    executor = llm.executor
    model = executor.runner.model
    sparse = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, SparseMoE)]
    seen: list[list[torch.Tensor]] = [[] for _ in sparse]
    hooks = [moe.gate.register_forward_hook(lambda m, a, out, i=i: seen[i].append(out.detach().clone()))
             for i, moe in enumerate(sparse)]
    by_hooks = []

    def shape_done(n, row):  # the routers' top-k over the shape's executions, per layer
        ids = [route(torch.cat(logits), moe.top_k, moe.renormalize)[1] for logits, moe in zip(seen, sparse)]
        by_hooks.append(float(np.mean([len(torch.unique(i)) for i in ids])))
        for logits in seen:
            logits.clear()

    tally = ExpertTally.of(executor)  # drops what start-up routed
    assert tally is not None
    table = profile_executor(executor, llm.scheduler_config, GRID, progress=shape_done, experts=tally)
    for hook in hooks:
        hook.remove()
    assert len(table) == len(by_hooks) > 8
    assert table.moe_distinct_experts.tolist() == pytest.approx(by_hooks)
    num_experts = model.shape.num_experts
    assert ((table.moe_distinct_experts >= 1) & (table.moe_distinct_experts <= num_experts)).all()
    assert table.moe_distinct_experts.nunique() > 2  # it varies with the step, not one value per size
    # every routed token went to the total: k choices per token and layer, per execution
    assert tally.total.tokens.sum() > 0
    assert (tally.total.tokens.sum(axis=1) % model.shape.num_experts_per_tok == 0).all()
    assert executor.take_expert_counts().tokens.sum() == 0
    llm.shutdown()


def test_none_without_a_counter_and_the_per_layer_mean():
    dense = LLM("tiny-qwen3", load_format="dummy", device="cpu", max_model_len=64, record_expert_counts=True)
    assert ExpertTally.of(dense.executor) is None
    assert ExpertTally.of(object()) is None  # a simulated executor has no counter
    dense.shutdown()
    assert distinct_per_layer(np.array([[0, 3, 1, 0], [5, 0, 0, 0]])) == 1.5


def test_validation_prices_random_shapes_by_the_expected_count_too(tmp_path):
    import pandas as pd

    from harness.calibration.fit import validate
    from tests.sim.test_moe_measured_grid import measured_grid

    path = tmp_path / "grid.csv"
    measured_grid(str(path), "moe_distinct_experts")
    table = pd.read_csv(path).assign(set="grid", kind="decode")
    table = pd.concat([table] + [table[table.num_prefill_tokens > 0]] * 4, ignore_index=True)  # a prefill kept
    table.loc[(table.index % 7 == 3) & (table.num_prefill_tokens == 0), "set"] = "random"
    _, validation = validate(table, None)
    assert {"random_shapes", "random_shapes_expected"} <= set(validation["set"])
    _, dense = validate(table.drop(columns="moe_expected_experts"), None)  # no expectation: no such rows
    assert "random_shapes_expected" not in set(dense["set"])
