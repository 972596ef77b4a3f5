"""backend.repeated_reads=overlap: a decode step's KV read as the slower of its memory and L2 pipes
(sim.overlapped_reads). A step sharing nothing is priced as before; a few repeats cost nothing; many
make the step L2-bound, priced rho x a a token read; never more than the additive prior; a fit that
measured repeats keeps its own price; the setting is refused in one line when unknown."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.graph_sizes import GraphSizes, decode_graph_sizes, prefill_graph_sizes
from harness.run import run_once
from harness.scripting import compose_run_config
from sim.config import SimConfig
from sim.features import step_features
from sim.overlapped_reads import OverlappedReads
from sim.profiled import ProfiledCostModel
from sim.repeated_reads import REPEATED_READS, l2_price_ratio, with_prior
from tests.sim.helpers import decode_batch, hardware
from tests.sim.test_repeated_reads import BEFORE, H100_PROFILE, PLANS, shared

pytestmark = pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")
GRAPHS = GraphSizes(decode_graph_sizes(512, 512), prefill_graph_sizes(4096))
BASE = ProfiledCostModel.load(H100_PROFILE, GRAPHS)
H100 = hardware("h100")
ADDITIVE, OVERLAP = with_prior(BASE, H100), with_prior(BASE, H100, "overlap")
RHO = l2_price_ratio(H100)
A = dict(zip(BASE.fits["decode_graph"].linear_features,
             BASE.fits["decode_graph"].linear_coefs))["decode_context_tokens"]


def test_steps_that_share_nothing_are_priced_as_before():
    assert [OVERLAP.predict_features(step_features(p, GRAPHS)) for p in PLANS] == pytest.approx(BEFORE["profiled"],
                                                                                                 rel=1e-12)


def test_the_rule_prices_the_device_fits_of_the_prior_and_no_host_part():
    assert OVERLAP.overlapped_reads is not None and OVERLAP.overlapped_reads.ratio == pytest.approx(RHO)
    assert {"decode_graph", "gpu:decode_graph", "decode_eager", "prefill_graph"} <= OVERLAP.overlapped_reads.fits
    assert not any(name.startswith(("launch:", "lead:", "host")) for name in OVERLAP.overlapped_reads.fits)
    assert OVERLAP.fits == BASE.fits  # no linear price of repeats added
    assert ADDITIVE.overlapped_reads is None


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(2, 256), context=st.integers(600, 4000), shared_tokens=st.integers(0, 512))
def test_repeats_ride_free_up_to_the_l2_bound_and_never_cost_more_than_additive(batch, context, shared_tokens):
    step = decode_batch([context] * batch)
    repeated = (batch - 1) * shared_tokens
    total = batch * (context + 1)  # each decode reads its context and its new token
    plain, additive, overlap = (m.predict_features(step_features(shared(step, repeated), GRAPHS))
                                for m in (BASE, ADDITIVE, OVERLAP))
    assert overlap == pytest.approx(plain - A * min(repeated, (1 - RHO) * total), rel=1e-9, abs=1e-12)
    assert overlap <= additive + 1e-12
    if repeated <= (1 - RHO) / RHO * (total - repeated):  # the memory pipe is the slower: repeats are free
        assert overlap == pytest.approx(plain - A * repeated, rel=1e-9, abs=1e-12)


def test_many_repeats_make_the_read_l2_bound():
    step = decode_batch([2048] * 256)
    total = 256 * 2049
    repeated = 255 * 2000  # R / U of about 20
    plain = BASE.predict_features(step_features(step, GRAPHS))
    overlap = OVERLAP.predict_features(step_features(shared(step, repeated), GRAPHS))
    # the whole context read at L2's price instead of memory's
    assert plain - overlap == pytest.approx(A * (1 - RHO) * total, rel=1e-9)


def test_a_fit_that_measured_repeats_keeps_its_price():
    measured = with_prior(BASE, H100)  # stands for a profile whose fits carry the coefficient
    assert with_prior(measured, H100, "overlap") is measured
    fit = measured.fits["decode_graph"]
    assert REPEATED_READS in fit.linear_features
    assert OverlappedReads(RHO, frozenset()).saving_s("decode_graph", fit, {REPEATED_READS: 1e4,
                                                                              "decode_context_tokens": 5e4}) == 0


@pytest.mark.parametrize("bad", ["linear", "", None, 1])
def test_an_unknown_rule_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match=r"SimConfig.repeated_reads must be one of additive, overlap"):
        SimConfig(repeated_reads=bad)
    with pytest.raises(ValueError, match="repeated_reads must be one of"):
        with_prior(BASE, H100, bad)
    with pytest.raises(ValueError, match="ratio must be in"):
        OverlappedReads(0.0, frozenset())


def test_the_setting_reaches_the_simulator_and_fast_forward_prices_it_as_step_by_step(tmp_path):
    from tests.harness.serve.test_step_prices import mooncake_bench_folder

    overrides = mooncake_bench_folder(tmp_path)  # every prompt shares its first 512 tokens
    base = ["backend=sim", "backend.cost_model=profiled", *overrides]
    additive = run_once(compose_run_config(base), False)
    rc = compose_run_config([*base, "backend.repeated_reads=overlap"])
    fast = run_once(rc, False)
    slow = run_once(dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, fast_forward=False)), False)
    assert fast.requests.equals(slow.requests)
    assert fast.requests["tpot"].median() < additive.requests["tpot"].median()  # the shared blocks ride free
