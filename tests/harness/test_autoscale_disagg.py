"""A disaggregated fleet whose pools scale on their own (fleet.<pool>.autoscale): a decode-bound surge
grows the decode pool only, a prefill-bound one the prefill pool only; transfers go only to decode
replicas serving when they start; held pools serve as the static disaggregated fleet; bad input is
one line."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.disagg import pool_autoscale, run_disagg_autoscaled
from harness.config import build_run_config
from harness.convert import ConfigError
from harness.fleet.config import build_fleet
from harness.fleet.disagg import run_disagg_once
from harness.fleet.disagg_config import build_disagg
from harness.study import run_study
from tests.harness.conftest import compose_config

POLICY = ("{policy: queue, target_waiting: 2, max_replicas: 4, interval_s: 2, scale_up_cooldown_s: 6, "
          "scale_down_cooldown_s: 10, provision_s: 3, calibration: false, graph_capture_s: 1}")
SURGE = ["fleet=disaggregated", "workload=poisson", "workload.rate_profile=[[0,2],[10,40],[30,2]]",
         "workload.duration_s=60", "scheduler.max_num_seqs=8"]
DECODE_BOUND = ["workload.prompt_len.low=50", "workload.prompt_len.high=100", "workload.output_len.low=200",
                "workload.output_len.high=400"]
PREFILL_BOUND = ["workload.prompt_len.low=3000", "workload.prompt_len.high=4000", "workload.output_len.low=2",
                 "workload.output_len.high=4", "workload.rate_profile=[[0,2],[10,120],[30,2]]"]


def _run(overrides, decode_policy=POLICY):
    cfg = compose_config(SURGE + overrides + [f"fleet.prefill.autoscale={POLICY}",
                                              f"fleet.decode.autoscale={decode_policy}"])
    rc = build_run_config(cfg)
    _, router = build_fleet(cfg, with_fleet=False)
    fleet = build_disagg(cfg)
    return run_disagg_autoscaled(rc, fleet, router, pool_autoscale(fleet, AutoscaleConfig(), SLO()), SLO(),
                                 progress=False)


def _check_transfers(outcome, result):
    decode = result.decode.lifetimes
    moved = outcome.requests[outcome.requests["decode_replica"] >= 0]
    for _, r in moved.iterrows():
        life = decode[int(r["decode_replica"])]
        assert life.ready_s <= r["transfer_start"] and (life.drain_s is None or r["transfer_start"] <= life.drain_s)
    assert len(outcome.requests) == outcome.summary.to_row()["num_requests"]


def test_a_decode_bound_surge_grows_the_decode_pool_only():
    outcome, result, frame = _run(DECODE_BOUND)
    assert len(result.prefill.lifetimes) == 1 and result.prefill.events == []
    ups = [e for e in result.decode.events if e.direction == "up"]
    assert ups and ups[0].time_s >= 10 and any(e.direction == "down" for e in result.decode.events)
    _check_transfers(outcome, result)
    assert frame["decode_serving"].max() > 1 and frame["prefill_serving"].max() == 1
    assert outcome.summary.to_row()["mean_decode_replicas"] > 1


def test_a_prefill_bound_surge_grows_the_prefill_pool_only():
    # the decode pool's own threshold: the bunches of first tokens a surge of prefills hands over wait briefly
    outcome, result, _ = _run(PREFILL_BOUND, POLICY.replace("target_waiting: 2", "target_waiting: 64"))
    assert len(result.decode.lifetimes) == 1 and result.decode.events == []
    assert any(e.direction == "up" for e in result.prefill.events)
    routed = outcome.requests.groupby("prefill_replica")["arrival"].min()
    for index, first in routed.items():  # each prefill replica's first arrival came once it served
        assert first >= result.prefill.lifetimes[int(index)].ready_s
    _check_transfers(outcome, result)


@pytest.mark.parametrize("fast_forward", ["true", "false"])
def test_pools_held_at_their_size_serve_as_the_static_disaggregated_fleet_step_by_step(fast_forward):
    """NOTE the reference is the static fleet stepped one step at a time: run_disaggregated lets a
    decode replica fast-forward past a transfer landing on it (its stop_at is never set), so with
    fast-forward on its requests differ; the elastic fleet bounds each replica by the next event."""
    overrides = ["fleet=disaggregated", "workload=poisson", "workload.num_requests=60", "workload.rate=20",
                 "fleet.decode_replicas=2", "workload.prompt_len.high=300", "workload.output_len.high=100",
                 f"backend.fast_forward={fast_forward}"]
    cfg = compose_config(overrides + ["fleet.decode.autoscale={min_replicas: 2, max_replicas: 2, policy: queue}"])
    rc = build_run_config(cfg)
    _, router = build_fleet(cfg, with_fleet=False)
    fleet = build_disagg(cfg)
    held, _, _ = run_disagg_autoscaled(rc, fleet, router, pool_autoscale(fleet, AutoscaleConfig(), SLO()), SLO(),
                                       progress=False)
    stepped = build_run_config(compose_config(overrides + ["backend.fast_forward=false"]))
    static = run_disagg_once(stepped, fleet, router, progress=False)
    columns = ["request_id", "first_token", "finish", "prefill_replica", "decode_replica", "transfer_start"]
    pd.testing.assert_frame_equal(held.requests[columns], static.requests[columns])


@pytest.mark.parametrize("overrides, message", [
    (["autoscale.policy=queue"], r"^autoscale.policy=queue: with fleet=disaggregated each pool scales on its own"),
    (["fleet.decode.autoscale={policy: queue, min_replicas: 3, max_replicas: 2}"],
     r"^fleet.decode.autoscale: autoscale.min_replicas=3 is above autoscale.max_replicas=2$"),
    (["fleet.decode.autoscale={policy: slo}"], r"^fleet.decode.autoscale.policy=slo with fleet.decode.autoscale.slo_m"),
    (["fleet.prefill_replicas=3", "fleet.prefill.autoscale={policy: queue, max_replicas: 2}"],
     r"^fleet.prefill_replicas=3 \(the starting count\) must be within"),
    (["fleet.decode.autoscale={policy: queue}", "backend=engine"], r"simulator only \(backend=sim\), got backend=eng"),
    (["fleet.decode.autoscale={policy: queue}", "fleet.transfer.recv_behind_step=true"],
     r"^fleet.transfer.recv_behind_step=true is not modelled with autoscaled pools"),
])
def test_bad_pool_autoscaling_is_one_line(overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config(["fleet=disaggregated", "output.plots=false", *overrides]), tmp_path)
    assert "\n" not in str(error.value)


def test_a_prefill_replica_stalled_by_blocked_transfers_resumes_once_decode_replicas_start():
    """A decode pool slow to start (20 s) leaves the prefill replica holding blocks for requests no decode
    replica can take; it must resume when the new decode replicas take them, and every request finish."""
    # 40 blocks: the prefill replica holds at most 40 prompts waiting for a decode replica, then stalls
    slow_start = POLICY.replace("provision_s: 3", "provision_s: 20")
    outcome, result, _ = _run(DECODE_BOUND + ["cache.num_blocks=40"], slow_start)
    assert outcome.summary.to_row()["num_requests"] == len(outcome.requests) > 0
    assert any(life.ready_s > 30 for life in result.decode.lifetimes[1:])
    assert result.fleet.max_blocked > 0
    _check_transfers(outcome, result)
