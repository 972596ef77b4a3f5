"""The decode kernel's merge of split partials as a fit term (sim.decode_merge,
backend.decode_merge): the committed H200 grid fits it at the probe's price, a fitted model prices
a step's merge (its repeats' too, as fast-forward asks), and the setting's checks."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest

from engine.core.graph_sizes import GraphSizes
from experiments.fidelity.refit_merge import kernel_of, refit
from harness.scripting import compose_run_config
from sim.cost_model import make_cost_model
from sim.decode_merge import row_merge_splits
from sim.decode_programs import DECODE_MERGE_SPLITS
from tests.sim.helpers import decode_batch

REPO = Path(__file__).resolve().parents[2]
GRID = REPO / "experiments" / "fidelity" / "code_completion_h200_r2" / "qwen3-0.6b" / "profile.csv.gz"
KERNEL = kernel_of("qwen3-0.6b", "h200")


@pytest.fixture(scope="module")
def fits():
    grid = pd.read_csv(GRID)
    return refit(grid, KERNEL, 16384), refit(grid, None, 16384)


def _price(fit, name):
    return dict(zip(fit.fits[name].linear_features, fit.fits[name].linear_coefs)).get(DECODE_MERGE_SPLITS)


def test_the_h200_grid_fits_the_merge_at_the_price_the_probe_timed(fits):
    """The probe's steps (experiments/fidelity/small_batch_decode_h200): 9.0 us a step a split."""
    merged, plain = fits
    assert 8e-6 < _price(merged, "decode_graph") < 11e-6 and _price(plain, "decode_graph") is None
    context = dict(zip(merged.fits["decode_graph"].linear_features, merged.fits["decode_graph"].linear_coefs))
    assert context["decode_context_tokens"] == pytest.approx(2.6e-8, rel=0.05)


def test_a_grid_rows_merge_is_its_spread_around_the_mean_in_the_captured_graph():
    row = {"num_prefill_tokens": 0, "num_decode_tokens": 1, "num_seqs": 1, "decode_context_tokens": 2048,
           "cuda_graph": 1, "graph_batch_size": 1}
    assert row_merge_splits(row, KERNEL, 16384) == 32  # 64 splits, 64-key pieces
    assert row_merge_splits({**row, "num_prefill_tokens": 5}, KERNEL, 16384) == 0  # not a decode-only step
    wide = {**row, "num_seqs": 256, "num_decode_tokens": 256, "graph_batch_size": 256,
            "decode_context_tokens": 256 * 500}  # contexts spread over 250..750 tokens
    assert row_merge_splits(wide, KERNEL, 16384) == 2  # the graph's 8 splits: the longest past the mean share
    assert row_merge_splits({**wide, "cuda_graph": 0}, KERNEL, 16384) == 0  # eager: one split, one program each


def test_a_fitted_model_prices_few_long_sequences_by_their_merge_and_its_repeats_alike(fits, tmp_path):
    merged, plain = fits
    paths = {}
    for name, fit in (("merge", merged), ("plain", plain)):
        paths[name] = tmp_path / f"{name}.csv"
        fit.to_csv(paths[name])
    rc = compose_run_config(["model=qwen3-0.6b", "hardware=h200", "backend=sim", "backend.cost_model=profiled",
                             f"backend.profile_path={paths['merge']}", "backend.decode_programs=false"])
    graphs = GraphSizes((1, 2, 4, 8, 16, 32), (), 8192)
    model = make_cost_model(rc.model, rc.hardware, rc.sim, graphs)
    assert model.merge_programs is not None
    short, long = decode_batch([500]), decode_batch([3999])
    # one sequence: 8 merged splits at 501 tokens, 63 at 4,000 (64 splits, pieces of a tile and more)
    rise = model.step_time(long) - model.step_time(short)
    context = dict(zip(model.fits["decode_graph"].linear_features, model.fits["decode_graph"].linear_coefs))
    assert rise == pytest.approx(context["decode_context_tokens"] * 3499 + _price(merged, "decode_graph") * (63 - 8),
                                 rel=0.02)
    step = decode_batch([1000, 3000])
    for j, repeat in enumerate(itertools.islice(model.decode_repeats(step), 3), start=1):
        assert repeat == model.step_time(decode_batch([1000 + j, 3000 + j]))


def test_the_setting_needs_the_decode_kernels_figures():
    with pytest.raises(ValueError, match="decode_merge must be true or false"):
        compose_run_config(["backend=sim", "backend.decode_merge=3"])
    rc = compose_run_config(["model=qwen3-0.6b", "hardware=h200", "backend=sim", "backend.cost_model=profiled",
                             f"backend.profile_path={GRID}", "backend.decode_merge=true",
                             "hardware.decode_program_bandwidth=null"])
    with pytest.raises(ValueError, match="decode_merge=true needs hardware.num_sms and hardware.decode_program_band"):
        make_cost_model(rc.model, rc.hardware, rc.sim)


def test_a_merge_fit_carried_to_another_gpu_prices_the_merge_there(fits, tmp_path):
    merged, _ = fits
    path = tmp_path / "merge.csv"
    merged.to_csv(path)
    rc = compose_run_config(["model=qwen3-0.6b", "hardware=h100", "backend=sim", "backend.cost_model=profiled",
                             f"backend.profile_path={path}", "backend.profile_hardware=h200",
                             "backend.decode_programs=false"])
    model = make_cost_model(rc.model, rc.hardware, rc.sim, GraphSizes((1, 2, 4), (), 8192))
    assert model.merge_programs is not None and model.merge_programs.num_sms == rc.hardware.num_sms
    assert model.step_time(decode_batch([3999])) > model.step_time(decode_batch([500]))
