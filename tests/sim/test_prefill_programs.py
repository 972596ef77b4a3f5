"""The prefill kernel's programs in the profiled model (sim.prefill_programs): a chunk after a cached
context waits on its few long programs, which a fit on attention pairs alone cannot price; a fit
with the term recovers the programs' rate from a grid and tells fresh prompts from cached ones, and
a profile without it is priced exactly as before."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.graph_sizes import GraphSizes
from harness.scripting import compose_run_config
from sim.cost_model import make_cost_model
from sim.features import attention_pairs, step_features
from sim.prefill_programs import PREFILL_PROGRAM_KEYS, PrefillPrograms
from sim.profiled import ProfiledCostModel
from tests.sim.helpers import decode, hardware, model, plan, prefill

pytestmark = pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")

# Qwen3-0.6B on an H100/H200: 8 KV heads, group 2, 28 layers, 132 SMs, two programs per SM
KERNEL = PrefillPrograms(num_kv_heads=8, group=2, num_layers=28, num_sms=132, programs_per_sm=2)
GRAPHS = GraphSizes(decode=(1, 2, 4, 8), prefill=(16, 64, 128, 256, 512, 1024, 2048))


def test_a_small_chunk_after_a_cached_context_waits_on_its_longest_program():
    # 16 tokens after 2,048 cached keys: 8 programs of 2,064 keys on 264 slots, one per KV head
    excess = KERNEL.excess_keys([16], [2048], graph=True)
    assert excess == pytest.approx(28 * 2064 * (1 - 8 / 264))
    # the same chunk fresh walks 16 keys
    assert KERNEL.excess_keys([16], [0], graph=True) == pytest.approx(28 * 16 * (1 - 8 / 264))


def test_programs_that_fill_the_gpu_evenly_add_nothing():
    # 33 one-tile sequences x 8 KV heads = 264 programs of equal keys: the slots, evenly
    assert KERNEL.excess_keys([32] * 33, [0] * 33, graph=True) == 0.0
    assert KERNEL.excess_keys([32] * 66, [512] * 66, graph=False) == 0.0
    assert KERNEL.excess_keys([], [], graph=True) == 0.0


def test_both_launches_start_the_longest_tiles_first():
    # one fresh 4,096-token prompt: 64 tiles of 64 queries x 8 KV heads on 264 slots; started longest
    # first, the makespan exceeds the even spread by less than one tile's keys a layer (started head
    # after head, the last heads' longest tiles would trail it by ~2,400 keys a layer)
    for graph in (True, False):
        keys = KERNEL.launch_keys([4096], [0], graph)
        assert np.all(keys[:8] == 4096) and np.all(np.diff(keys) <= 0)
        assert 0.0 <= KERNEL.excess_keys([4096], [0], graph) <= 28 * 64
    # an eager launch's waves count tiles back from the longest query's last: the 4,096-token
    # query's tiles 63..32 alone (8 programs each), then tile 31 of both, the 2,048-token one's last
    keys = KERNEL.launch_keys([4096, 2048], [0, 0], graph=False)
    assert keys[:8].tolist() == [4096.0] * 8 and keys[8:16].tolist() == [4032.0] * 8
    assert keys[32 * 8:32 * 8 + 16].tolist() == [2048.0] * 16


@settings(max_examples=150, deadline=None)
@given(tokens=st.integers(1, 3000), seqs=st.integers(1, 40), cached=st.integers(0, 8192),
       extra=st.integers(1, 4096), graph=st.booleans())
def test_the_wait_grows_with_the_cached_context_while_the_programs_fit_the_slots(tokens, seqs, cached, extra, graph):
    query = [tokens] * seqs
    if KERNEL.launch_keys(query, [0] * seqs, graph).size > KERNEL.slots:
        return  # more programs than slots: list scheduling, no such order in general
    before = KERNEL.excess_keys(query, [cached] * seqs, graph)
    after = KERNEL.excess_keys(query, [cached + extra] * seqs, graph)
    assert before >= 0.0
    assert after >= before * (1 - 1e-12)  # equal up to the sums' rounding where the extra keys spread evenly
    # no more than the longest program's keys in every layer
    assert after <= 28 * (cached + extra + tokens)


@settings(max_examples=100, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 8192)), min_size=1, max_size=80),
       graph=st.booleans())
def test_the_wait_is_bounded_by_the_makespan_and_the_launch_has_the_kernels_programs(lens, graph):
    query, cached = [q for q, _ in lens], [c for _, c in lens]
    keys = KERNEL.launch_keys(query, cached, graph)
    block_q = 64 if max(query) >= 4096 else 32
    assert keys.size == 8 * sum(-(-q // block_q) for q in query)
    # each KV head walks the chunk's attention pairs over block_q tokens, at least
    assert keys.sum() >= 8 * sum(attention_pairs(q, c) for q, c in lens) / block_q - 1e-6
    excess = KERNEL.excess_keys(query, cached, graph)
    assert 0.0 <= excess <= 28 * keys.sum()


def test_a_plan_and_its_table_row_have_the_same_term():
    # uniform chunks (the grid's shapes) and a mixed step's decodes over equal contexts
    for entries in ([prefill(64, 512, rid=f"p{i}") for i in range(4)],
                    [prefill(128, 0, rid="p"), *(decode(1023, rid=f"d{i}") for i in range(8))]):
        step = plan(*entries)
        row = step_features(step, GRAPHS)
        assert KERNEL.plan_keys(step, bool(row["cuda_graph"])) == pytest.approx(KERNEL.row_keys(row))
    assert KERNEL.plan_keys(plan(decode(100), decode(200)), True) == 0.0


def synthetic_grid(rate_s_per_key: float, per_byte_s: float = 0.0,
                   kernel: PrefillPrograms = KERNEL) -> pd.DataFrame:
    """The grid's prefill shapes (chunks of 16-2048 tokens over 1-32 sequences after 0-2,048
    cached tokens each), timed by a law with a planted program rate and, where per_byte_s is given,
    a planted price of the cached K/V bytes (kernel.cached_kv_bytes)."""
    rows = []
    for tokens, seqs, cached in itertools.product((16, 64, 128, 256, 512, 1024, 2048), (1, 4, 16, 32),
                                                  (0, 512, 2048)):
        if seqs > tokens:
            continue
        step = plan(*(prefill(tokens // seqs, cached, rid=f"p{i}") for i in range(seqs)))
        row = step_features(step, GRAPHS)
        keys = kernel.plan_keys(step, True)
        row["duration_s"] = 1.2e-3 + 1.5e-6 * row["graph_batch_size"] + 6e-10 * row["prefill_attention_pairs"] \
            + rate_s_per_key * keys + (per_byte_s * kernel.cached_kv_bytes(row) if per_byte_s else 0.0)
        rows.append(row)
    return pd.DataFrame(rows)


def test_a_fit_on_a_grid_recovers_the_planted_rate_and_prices_both_kinds_of_rows():
    planted = 2.4e-8  # ~42 M keys/s per program, the H200 grid's
    grid = synthetic_grid(planted)
    fitted = ProfiledCostModel.fit(grid, GRAPHS, prefill_programs=KERNEL)
    coefs = dict(zip(fitted.fits["prefill_graph"].linear_features, fitted.fits["prefill_graph"].linear_coefs))
    assert coefs[PREFILL_PROGRAM_KEYS] == pytest.approx(planted, rel=0.02)
    error = fitted.predict(grid) / grid["duration_s"].to_numpy() - 1
    assert np.abs(error).max() < 0.01
    # without the term the knots sit between fresh and cached rows
    plain = ProfiledCostModel.fit(grid, GRAPHS)
    error = plain.predict(grid) / grid["duration_s"].to_numpy() - 1
    assert np.abs(error).max() > 0.1
    # and step_time prices a simulated step of a grid shape as its row
    step = plan(prefill(16, 2048))
    assert fitted.step_time(step) == pytest.approx(1.2e-3 + 1.5e-6 * 16 + 6e-10 * attention_pairs(16, 2048)
                                                   + planted * KERNEL.plan_keys(step, True), rel=0.02)


def test_a_saved_fit_keeps_the_term_and_needs_the_kernel_to_price_it(tmp_path):
    fitted = ProfiledCostModel.fit(synthetic_grid(2e-8), GRAPHS, prefill_programs=KERNEL)
    path = tmp_path / "fit.csv"
    fitted.to_csv(path)
    with pytest.raises(ValueError, match="prefill_programs_per_sm"):
        ProfiledCostModel.load(path, GRAPHS)
    again = ProfiledCostModel.load(path, GRAPHS, KERNEL)
    step = plan(prefill(64, 2048))
    assert again.step_time(step) == pytest.approx(fitted.step_time(step))
    # a grid loaded without fit_programs is fitted as before, and the kernel is then not used
    grid = tmp_path / "grid.csv"
    synthetic_grid(2e-8).to_csv(grid, index=False)
    plain = ProfiledCostModel.load(grid, GRAPHS, KERNEL, fit_programs=False)
    assert not plain.uses_prefill_programs
    assert plain.step_time(step) == ProfiledCostModel.fit(synthetic_grid(2e-8), GRAPHS).step_time(step)


def test_the_cost_model_takes_the_kernel_from_the_model_and_gpu(tmp_path):
    path = tmp_path / "grid.csv"
    synthetic_grid(2e-8).to_csv(path, index=False)
    rc = compose_run_config(["backend=sim", "backend.cost_model=profiled", f"backend.profile_path={path}",
                             "hardware=h100", "model=qwen3-0.6b", "backend.prefill_programs=true"])
    cost = make_cost_model(rc.model, rc.hardware, rc.sim, GRAPHS)
    assert isinstance(cost, ProfiledCostModel) and cost.uses_prefill_programs
    assert cost.prefill_programs == PrefillPrograms.of(model("qwen3-0.6b"), hardware("h100"))
    # Qwen3-8B: 32 query heads over 8 KV heads, 36 layers
    eight = PrefillPrograms.of(model("qwen3-8b"), hardware("h200"))
    assert eight is not None and (eight.group, eight.num_layers, eight.num_kv_heads) == (4, 36, 8)
    assert PrefillPrograms.of(model("qwen3-0.6b"), hardware("cpu")) is None
    cpu = dataclasses.replace(rc.sim, prefill_programs=True)
    with pytest.raises(ValueError, match="prefill_programs_per_sm"):
        make_cost_model(rc.model, hardware("cpu"), cpu, GRAPHS)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="programs_per_sm"):
        PrefillPrograms(8, 2, 28, 132, 0)
    with pytest.raises(ValueError, match="prefill_programs"):
        compose_run_config(["backend=sim", "backend.prefill_programs=maybe"])


def test_a_tools_own_steps_are_priced_with_the_term_as_the_simulator_prices_them():
    """experiments.autoscale.midrun_steps builds each step's features itself (its chunks and decode
    lengths rebuilt from a run's tables): with a profile fitted with the term, each step costs what
    step_time() gives the same step, uneven chunks included."""
    from experiments.autoscale import midrun_steps

    decodes = []  # midrun_steps reads the decode graphs' price of a context token
    for size, context in itertools.product((1, 2, 4, 8), (100, 1000, 4000)):
        row = step_features(plan(*(decode(context, rid=f"d{i}") for i in range(size))), GRAPHS)
        decodes.append({**row, "duration_s": 1e-3 + 2e-6 * row["graph_batch_size"] + 1e-9 * context * size})
    grid = pd.concat([synthetic_grid(2.4e-8), pd.DataFrame(decodes)], ignore_index=True)
    fitted = ProfiledCostModel.fit(grid, GRAPHS, prefill_programs=KERNEL)
    chunks = [[(16, 2048)], [(64, 512), (32, 0), (128, 1536)], [], [(3000, 0)]]
    lens = [[], [], [101, 2001, 41], []]  # a decode's length includes its new token
    steps = pd.DataFrame({"kind": ["prefill", "prefill", "decode", "prefill"], "start": [0.0, 1.0, 2.0, 3.0],
                          "duration": [0.1] * 4})
    prices, _, _ = midrun_steps.price(fitted, GRAPHS, False, steps, chunks, lens)
    simulated = [plan(*(prefill(n, c, rid=f"p{j}") for j, (n, c) in enumerate(step)),
                      *(decode(n - 1, rid=f"d{j}") for j, n in enumerate(ls))) for step, ls in zip(chunks, lens)]
    assert prices == pytest.approx([fitted.step_time(step) for step in simulated], rel=1e-12)
    # the uneven step waits on its 2,048-key programs, which evened-out chunks would not show
    assert KERNEL.plan_keys(simulated[1], True) > 1.5 * KERNEL.row_keys(step_features(simulated[1], GRAPHS))


def test_step_features_without_the_term_take_it_from_their_totals_or_say_what_is_missing():
    fitted = ProfiledCostModel.fit(synthetic_grid(2.4e-8), GRAPHS, prefill_programs=KERNEL)
    step = plan(*(prefill(64, 512, rid=f"p{i}") for i in range(4)))
    row = step_features(step, GRAPHS)  # what experiments' step pricers build: no program term
    assert PREFILL_PROGRAM_KEYS not in row
    assert fitted.predict_features(row) == pytest.approx(fitted.step_time(step), rel=1e-12)
    assert fitted.predict_features(row) == pytest.approx(fitted.predict(pd.DataFrame([row]))[0], rel=1e-12)
    with pytest.raises(ValueError, match=r"\['prefill_context_tokens'\]"):
        fitted.predict_features({k: v for k, v in row.items() if k != "prefill_context_tokens"})
    fitted.prefill_programs = None
    with pytest.raises(ValueError, match="prefill_programs_per_sm"):
        fitted.predict_features(row)
