"""backend.decode_programs_baseline (sim.decode_programs): grid_spread charges a decode step only
what its contexts' programs wait beyond a profiling grid row of as many sequences around the same
mean context (the grid's even spread, whose wait the profile's fit holds already); grid_waves takes
off only what that row's waves add, leaving the tail of its programs started together. "none" by
default: the price is the whole wait."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.scripting import compose_run_config
from sim.cost_model import make_cost_model
from sim.decode_programs import GRID_SPREAD, DecodePrograms, grid_spread_lens
from tests.sim.helpers import decode_batch

pytestmark = pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")

# Qwen3-0.6B on an H100 (8 KV heads, 28 layers, 512 B a key and head), with its waves (5 programs
# an SM) and a graph captured for 4,096-token contexts; the shipped H100 price of a context token
WAVES = DecodePrograms(num_kv_heads=8, num_layers=28, key_bytes=512, num_sms=132, program_bandwidth=12.9e9,
                       resident_per_sm=5)
BEYOND = dataclasses.replace(WAVES, baseline="grid_spread")
GRID_WAVES = dataclasses.replace(WAVES, baseline="grid_waves")
ALL_START = dataclasses.replace(WAVES, resident_per_sm=None)
PER_TOKEN = 3.877e-8


def test_the_grid_spread_is_the_grids_even_spread_around_the_mean():
    lens = grid_spread_lens(100, 1000.0)
    assert lens.min() >= 1000 * (1 - GRID_SPREAD) and lens.max() <= 1000 * (1 + GRID_SPREAD)
    assert abs(lens.mean() - 1000) < 1 and np.all(np.diff(lens) >= 0)
    assert grid_spread_lens(1, 3.0).tolist() == [3] and grid_spread_lens(4, 0.4).min() == 1


def test_a_grid_shaped_batch_is_charged_nothing_and_a_ragged_one_its_extra_wait():
    graph = (128, 4096)
    even = grid_spread_lens(128, 900.0).tolist()
    assert WAVES.excess_s(even, PER_TOKEN, graph) > 0  # the grid's own rows wait too: the fit holds it
    assert BEYOND.step_excess_s(even, PER_TOKEN, graph) == pytest.approx(0.0, abs=1e-12)
    # a served running set: most contexts short, a tenth long, the same mean
    ragged = [600] * 115 + [3600] * 13
    ragged = [n + (900 * 128 - sum(ragged)) // 128 for n in ragged]
    full, beyond = WAVES.excess_s(ragged, PER_TOKEN, graph), BEYOND.step_excess_s(ragged, PER_TOKEN, graph)
    assert full > WAVES.excess_s(even, PER_TOKEN, graph)
    assert beyond == pytest.approx(full - WAVES.excess_s(grid_spread_lens(128, np.mean(ragged)), PER_TOKEN, graph))
    assert 0 < beyond < full
    # an even batch (all the same context) waits less than the grid's spread: charged < 0
    assert BEYOND.step_excess_s([900] * 128, PER_TOKEN, graph) < 0
    # off: the whole wait, as excess_s
    assert WAVES.step_excess_s(ragged, PER_TOKEN, graph) == full


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(1, 4000), min_size=33, max_size=256))
def test_beyond_the_grid_never_charges_more_than_the_whole_wait(lens):
    graph = (256, 4096)
    assert BEYOND.step_excess_s(lens, PER_TOKEN, graph) <= WAVES.excess_s(lens, PER_TOKEN, graph) + 1e-15
    # below two programs an SM nothing is charged either way
    assert BEYOND.step_excess_s(lens[:32], PER_TOKEN) == 0.0


def _model(*overrides: str):
    rc = compose_run_config(["model=qwen3-0.6b", "hardware=h100", "backend=sim", "backend.cost_model=profiled",
                             "hardware.decode_programs_per_sm=5", *overrides])
    return make_cost_model(rc.model, rc.hardware, rc.sim, (1, 2, 4, 8, 16, 32, 48, 64, 96, 128))


def test_the_setting_reaches_the_profiled_models_decode_steps():
    off, whole = _model("backend.decode_programs=false"), _model()
    beyond = _model("backend.decode_programs_baseline=grid_spread")
    assert whole.decode_programs.baseline == "none" and beyond.decode_programs.baseline == "grid_spread"
    per_token = dict(zip(off.fits["decode_graph"].linear_features, off.fits["decode_graph"].linear_coefs))
    per_token = per_token["decode_context_tokens"]
    # the grid's shape: the waves alone charge it, beyond the grid's spread it costs what the fit prices
    even = decode_batch([int(n) - 1 for n in grid_spread_lens(96, 1000.0)])  # contexts before the step
    assert whole.step_time(even) > off.step_time(even) + 1e-4
    assert beyond.step_time(even) == pytest.approx(off.step_time(even), rel=1e-9)
    # any other set: the whole wait less the grid spread's of its size and mean (the kernel reads
    # one token more than decode_batch's contexts)
    for contexts in ([500] * 86 + [5500] * 10, list(range(100, 9700, 100))):
        step, lens = decode_batch(contexts), np.array(contexts) + 1
        grid = whole.decode_programs.excess_s(grid_spread_lens(lens.size, lens.mean()), per_token)
        assert beyond.step_time(step) == pytest.approx(whole.step_time(step) - grid, rel=1e-9)


def test_a_bad_baseline_is_refused_in_one_line():
    with pytest.raises(ValueError, match="decode_programs_baseline must be one of"):
        dataclasses.replace(compose_run_config([]).sim, decode_programs_baseline="grid")


def test_grid_waves_takes_off_the_grids_waves_and_keeps_its_all_start_tail():
    graph = (128, 4096)
    # long contexts just past two programs an SM, all in one wave: nothing to take off, the whole
    # wait of its longest programs is charged (grid_spread charges none of it)
    under = grid_spread_lens(36, 4300.0).tolist()
    whole = WAVES.excess_s(under, PER_TOKEN, (48, 8192))
    assert whole > 1e-4 and GRID_WAVES.step_excess_s(under, PER_TOKEN, (48, 8192)) == pytest.approx(whole, rel=1e-12)
    assert BEYOND.step_excess_s(under, PER_TOKEN, (48, 8192)) == pytest.approx(0.0, abs=1e-12)
    # past one wave: a grid-shaped batch is charged its programs' all-start tail, not its waves
    past = grid_spread_lens(96, 1000.0).tolist()
    assert WAVES.excess_s(past, PER_TOKEN, graph) > ALL_START.excess_s(past, PER_TOKEN, graph)
    assert GRID_WAVES.step_excess_s(past, PER_TOKEN, graph) == pytest.approx(ALL_START.excess_s(past, PER_TOKEN, graph))
    # any other set: its whole wait, less the grid spread's waves over that spread's all-start wait
    ragged = [500] * 86 + [3500] * 10
    grid = grid_spread_lens(len(ragged), float(np.mean(ragged))).tolist()
    expected = WAVES.excess_s(ragged, PER_TOKEN, graph) - (WAVES.excess_s(grid, PER_TOKEN, graph)
                                                            - ALL_START.excess_s(grid, PER_TOKEN, graph))
    assert GRID_WAVES.step_excess_s(ragged, PER_TOKEN, graph) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(1, 6000), min_size=33, max_size=256))
def test_grid_waves_charges_between_grid_spread_and_the_whole_wait(lens):
    graph = (256, 8192)
    spread, waves = BEYOND.step_excess_s(lens, PER_TOKEN, graph), GRID_WAVES.step_excess_s(lens, PER_TOKEN, graph)
    assert spread - 1e-15 <= waves <= WAVES.excess_s(lens, PER_TOKEN, graph) + 1e-15


def test_grid_waves_without_the_hardwares_waves_is_refused_in_one_line():
    rc = compose_run_config(["model=qwen3-0.6b", "hardware=h100", "backend=sim", "backend.cost_model=profiled",
                             "backend.decode_programs_baseline=grid_waves"])
    with pytest.raises(ValueError, match="prices no waves .*decode_programs_per_sm"):
        make_cost_model(rc.model, rc.hardware, rc.sim, (1, 2, 4, 8, 16, 32, 48, 64, 96, 128))
    assert _model("backend.decode_programs_baseline=grid_waves").decode_programs.baseline == "grid_waves"
