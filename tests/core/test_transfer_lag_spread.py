"""fleet.transfer.landing_lag_sigma / send_lag_sigma: the receive side's host lags drawn per step end
and per send (engine.core.transfer_receive.LagDraw), and what the draws decide: whether a wire
ending near a decode step's end is seen at the check after it or a step later."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.step_log import StepRecord
from engine.core.transfer_receive import LagDraw, LandingWatch
from sim.kv_transfer import TransferConfig
from tests.core.test_disagg_recv_queue import SPECS, _run


def test_a_draw_is_the_occasions_own_and_sigma_zero_is_the_median():
    draw = LagDraw(1e-3, 0.5)
    assert draw.after_end(0, 0.0125) == draw.after_end(0, 0.0125)  # every path asking gets one lag
    assert draw.for_request("r7") == draw.for_request("r7")
    assert LagDraw(1e-3).after_end(3, 0.5) == 1e-3 and LagDraw(1e-3, 0.0).for_request("x") == 1e-3
    assert not LagDraw(0.0, 0.5) and LagDraw(0.0, 0.5).after_end(0, 1.0) == 0.0


def test_draws_have_the_median_and_the_lognormal_spread():
    draw = LagDraw(8e-4, 0.4)
    lags = np.array([draw.after_end(0, i * 7.3e-3) for i in range(4000)])
    assert math.isclose(np.median(lags), 8e-4, rel_tol=0.05)
    # P90 / P50 of a lognormal: exp(1.2816 sigma)
    assert math.isclose(np.quantile(lags, 0.9) / np.median(lags), math.exp(1.2816 * 0.4), rel_tol=0.06)
    assert (lags > 0).all()


@given(ends=st.lists(st.floats(0, 0.1), min_size=1, max_size=4, unique=True), t=st.floats(0, 0.12),
       sigma=st.sampled_from([0.0, 0.3, 0.8]))
def test_a_landing_is_seen_at_the_first_check_after_it_or_left_to_the_next_boundary(ends, t, sigma):
    draw = LagDraw(1e-3, sigma)
    watch = LandingWatch(draw)
    for end in sorted(ends):
        watch.stepped(0, StepRecord(end, 0.0, None))  # type: ignore[arg-type]
    checks = [e + draw.after_end(0, e) for e in ends if e <= t and e + draw.after_end(0, e) >= t]
    seen = watch.seen(0, t)
    assert seen == (min(checks) if checks else None)
    assert seen is None or seen >= t


def test_spread_lags_keep_every_transfer_past_its_wire_and_change_which_check_sees_some():
    fixed = _run(SPECS, handshake=True, queue_behind_step=True, recv_behind_step=True, landing_lag_s=4e-4,
                 send_lag_s=7e-4)
    spread = _run(SPECS, handshake=True, queue_behind_step=True, recv_behind_step=True, landing_lag_s=4e-4,
                  send_lag_s=7e-4, landing_lag_sigma=0.8, send_lag_sigma=0.8)
    again = _run(SPECS, handshake=True, queue_behind_step=True, recv_behind_step=True, landing_lag_s=4e-4,
                 send_lag_s=7e-4, landing_lag_sigma=0.8, send_lag_sigma=0.8)
    times = {r: t.transfer_s for r, t in spread.transfers.items()}
    assert times == {r: t.transfer_s for r, t in again.transfers.items()}  # reproducible
    assert times != {r: t.transfer_s for r, t in fixed.transfers.items()}
    assert all(t.transfer_s > 0 for t in spread.transfers.values())


def test_sigma_zero_is_the_fixed_lag():
    options = dict(handshake=True, queue_behind_step=True, recv_behind_step=True, landing_lag_s=4e-4, send_lag_s=7e-4)
    fixed, zero = _run(SPECS, **options), _run(SPECS, **options, landing_lag_sigma=0.0, send_lag_sigma=0.0)
    assert {r: t.transfer_s for r, t in fixed.transfers.items()} == {r: t.transfer_s for r, t in zero.transfers.items()}


def test_bad_sigmas_are_refused():
    for name in ("landing_lag_sigma", "send_lag_sigma"):
        for bad in (-0.1, 3.0, True, "x"):
            with pytest.raises(ValueError, match=f"fleet.transfer.{name}"):
                TransferConfig(handshake=True, **{name: bad})


def test_a_split_sigma_spreads_each_side_of_the_median_by_its_own():
    draw = LagDraw(8e-4, (0.2, 0.4))
    lags = np.array([draw.after_end(1, i * 3.1e-3) for i in range(4000)])
    assert math.isclose(np.median(lags), 8e-4, rel_tol=0.05)
    assert math.isclose(np.median(lags) / np.quantile(lags, 0.1), math.exp(1.2816 * 0.2), rel_tol=0.05)
    assert math.isclose(np.quantile(lags, 0.9) / np.median(lags), math.exp(1.2816 * 0.4), rel_tol=0.06)


def test_a_pair_from_the_config_is_below_and_above():
    assert TransferConfig(handshake=True, landing_lag_sigma=[0.2, 0.4]).landing_lag_sigma == (0.2, 0.4)  # type: ignore[arg-type]
    assert TransferConfig(handshake=True, send_lag_sigma=0.3).send_lag_sigma == 0.3
    for bad in ([0.1, 0.2, 0.3], [], [0.1, -1.0]):
        with pytest.raises(ValueError, match="fleet.transfer.send_lag_sigma"):
            TransferConfig(handshake=True, send_lag_sigma=bad)  # type: ignore[arg-type]


def test_the_harness_takes_the_pair_from_its_config():
    from harness.convert import to_dataclass
    config = to_dataclass(TransferConfig, {"handshake": True, "landing_lag_s": 8e-4, "landing_lag_sigma": [0.2, 0.4],
                                           "send_lag_sigma": 0.5}, "fleet.transfer")
    assert config.landing_lag_sigma == (0.2, 0.4) and config.send_lag_sigma == 0.5


def test_the_spread_of_a_lags_table_is_each_sides_median_sigma():
    import pandas as pd

    from experiments.disagg.transfer_parts import Z90, counts, spread
    rows = [{f"{lag}_p{q}_ms": m * math.exp(s * z * Z90) for lag, m, lo, hi in
             (("landing_lag", 0.8, 0.2, 0.4), ("send_lag", 1.8, 0.25, 0.5))
             for q, s, z in ((10, lo, -1), (50, lo, 0), (90, hi, 1))} for _ in range(3)]
    assert spread(pd.DataFrame(rows)) == {"landing_lag": (0.2, 0.4), "send_lag": (0.25, 0.5)}
    table = pd.DataFrame({"side": ["before", "after"], "p50_err_pct": [20.0, -15.0], "ttft_p50_s_err_pct": [9.9, 11],
                          "ttft_p90_s_err_pct": [0, 0], "tpot_p50_s_err_pct": [0, 0], "tpot_p90_s_err_pct": [0, 0],
                          "request_s_err_pct": [5.0, 5.1]})
    out = counts(table)
    assert out.loc["before", "p50_err_pct"] == 0 and out.loc["after", "p50_err_pct"] == 1
    assert out.loc["before", "all"] == 5 and out.loc["after", "all"] == 4 and (out.cells == 1).all()
