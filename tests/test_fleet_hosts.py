"""The fleet replicas' launch log (engine.core.launch_log), its join to the fleet's step table, the
kept files that carry it, the host speed read off them (experiments/disagg/fleet_hosts.py) and the
re-simulation at that speed (experiments/disagg/h200_run1/resim.py --hosts)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from engine.core.executor import StepTiming
from engine.core.graph_sizes import GraphSizes
from engine.core.launch_log import LaunchLog
from engine.core.loop import RunResult
from engine.core.plan import ScheduledRequest, StepPlan, StepResult, StepStats
from engine.core.sampling_params import SamplingParams
from experiments.disagg import fleet_hosts
from experiments.disagg.common import Pools, Setup
from experiments.disagg.h200_run1 import resim
from experiments.disagg.kept_steps import KEPT_COLUMNS, LAUNCH_KEPT, read_kept
from harness.output.metrics import with_launches
from sim.profiled import ProfiledCostModel
from sim.step_table import complete_columns

PROFILE = "profiles/h200/qwen3-0.6b.csv"
GRAPHS = GraphSizes(decode=(1, 2, 4, 8, 16))


def _plan(step: int, computed: list[int], prefill: int = 0, repeated: int = 0) -> StepPlan:
    entries = [ScheduledRequest(f"r{i}", [0], c, [0], True, SamplingParams(), 1, True) for i, c in enumerate(computed)]
    n = len(computed)
    stats = StepStats(step, "decode" if not prefill else "mixed", n, prefill, n, 0, n, 10, 0, 0, repeated, repeated)
    return StepPlan(entries, stats)


def test_the_launch_log_keeps_each_overlapped_step_and_its_decode_graph_features():
    log = LaunchLog(GRAPHS)
    result = StepResult(token_ids=[0, 0, 0], duration_s=0.01)
    log(_plan(0, [10, 20, 30], repeated=16), result, StepTiming(1.0, 1.0005, overlapped=True))
    log(_plan(1, [10, 20, 30], prefill=64), result, StepTiming(2.0, 2.002, overlapped=True))
    log(_plan(2, [10] * 17), result, StepTiming(3.0, 3.001, overlapped=True))  # past the largest graph
    log(_plan(3, [10, 20, 30]), result, StepTiming(4.0, 4.1, overlapped=False))  # execute(): no launch
    rows = log.take()
    assert [r[0] for r in rows] == [0, 1, 2] and log.take() == []
    step, launch, batch, context, repeated = rows[0]
    assert launch == pytest.approx(0.0005) and (batch, context, repeated) == (4, 63, 16)
    assert rows[1][2:] == (0, 0, 0) and rows[2][2:] == (0, 0, 0)


def test_launch_rows_join_the_step_table_by_step_and_a_simulated_replica_is_left_alone():
    steps = pd.DataFrame({"step": [0, 1, 2], "duration": [0.01, 0.02, 0.01]})
    kept = RunResult(requests=[], steps=[], launches=[(0, 0.0005, 4, 63, 0), (2, 0.0007, 8, 99, 16)])
    joined = with_launches(steps, kept)
    assert joined["launch_s"].iloc[0] == 0.0005 and math.isnan(joined["launch_s"].iloc[1])
    assert list(joined["graph_batch_size"]) == [4, 0, 8] and list(joined["decode_context_tokens"]) == [63, 0, 99]
    assert with_launches(steps, RunResult(requests=[], steps=[])) is steps


def _kept_cell(tmp_path, scale: float) -> pd.DataFrame:
    """A cell whose decode replica's launches are scale x the launch fit's price; a prefill step and
    a simulated one beside them; the call's profile is not here (this tree's is found)."""
    model, rows = ProfiledCostModel.load(PROFILE), []
    for i, (batch, context) in enumerate([(1, 500), (4, 3000), (16, 20000), (48, 90000), (128, 300000)]):
        features = {"num_prefill_tokens": 0, "num_seqs": batch, "num_seeded": 0, "cuda_graph": 1,
                    "decode_context_tokens": context, "decode_repeated_tokens": 0, "graph_batch_size": batch}
        rows.append({"side": "measured", "pool": "decode", "replica": 0, "step": i, "start": i * 0.01,
                     "duration": 0.01, "kind": "decode", "requests": batch, "prefill_tokens": 0,
                     "decode_tokens": batch, "running": batch, "waiting": 0, "preempted": 0, "kv_tokens": context,
                     "launch_s": scale * model.overlap_parts(features)[0], "graph_batch_size": batch,
                     "decode_context_tokens": context, "decode_repeated_tokens": 0})
    prefill = {**rows[0], "pool": "prefill", "kind": "prefill", "prefill_tokens": 900, "decode_tokens": 0,
               "launch_s": 0.05, "graph_batch_size": 0, "decode_context_tokens": 0}
    table = pd.DataFrame([prefill, *rows, {**rows[0], "side": "profiled", "launch_s": np.nan}])
    table.to_csv(tmp_path / "steps_1P1D_conversation_0.8.csv.gz", index=False, float_format="%.9f")
    setup = "Setup(model='qwen3-0.6b', hardware='h200', profile='/elsewhere/qwen3-0.6b.csv', overrides=())"
    (tmp_path / "settings.json").write_text(json.dumps({"setup": setup, "args": {}}))
    return table


def test_the_host_scale_of_launches_k_times_the_fit_is_k(tmp_path):
    _kept_cell(tmp_path, 1.7)
    fleet_hosts.main([str(tmp_path)])
    hosts = pd.read_csv(tmp_path / "hosts.csv", dtype={"load": str}).set_index("pool")
    assert hosts.loc["fleet", "host_scale"] == pytest.approx(1.7, abs=1e-4)
    assert hosts.loc["decode", "host_scale"] == pytest.approx(1.7, abs=1e-4) and hosts.loc["decode", "steps"] == 5
    assert hosts.loc["decode", "host_jitter"] == pytest.approx(0.0, abs=1e-4)
    assert math.isnan(hosts.loc["prefill", "host_scale"]) and hosts.loc["prefill", "steps"] == 0
    assert hosts.loc["fleet", "load"] == "0.8" and hosts.loc["fleet", "fleet"] == "1P1D"


def test_an_older_kept_file_without_launches_is_read_and_gives_no_host(tmp_path):
    table = _kept_cell(tmp_path, 1.0)[list(KEPT_COLUMNS)]
    path = tmp_path / "steps_1P1D_conversation_0.8.csv.gz"
    table.to_csv(path, index=False)
    steps = read_kept(path)
    assert not set(LAUNCH_KEPT) & set(steps.columns) and len(steps) == len(table)
    hosts = fleet_hosts.fleet_hosts(tmp_path, fleet_hosts.call_profile_path(tmp_path))
    assert hosts["host_scale"].isna().all() and (hosts["steps"] == 0).all()


def test_resim_prices_each_cell_at_its_fleets_host_scale(tmp_path):
    hosts = pd.DataFrame([
        {"fleet": "1P1D", "workload": "conversation", "load": "0.8", "pool": "decode", "replica": 0,
         "host_scale": 1.9, "host_jitter": 0.2, "steps": 9},
        {"fleet": "1P1D", "workload": "conversation", "load": "0.8", "pool": "fleet", "replica": -1,
         "host_scale": 1.6, "host_jitter": 0.2, "steps": 9},
        {"fleet": "2x", "workload": "conversation", "load": "0.8", "pool": "fleet", "replica": -1,
         "host_scale": np.nan, "host_jitter": np.nan, "steps": 0},
    ])
    hosts.to_csv(tmp_path / "hosts.csv", index=False)
    scales = resim.cell_host_scales(tmp_path / "hosts.csv")
    assert scales[("1P1D", "conversation", "0.8")] == 1.6 and math.isnan(scales[("2x", "conversation", "0.8")])
    setup = Setup("qwen3-0.6b", "h200", Pools(1, 1), profile=PROFILE, overrides=("backend.host_scale=2.5",))
    priced, scale = resim.at_host(setup, scales[("1P1D", "conversation", "0.8")])
    assert scale == 1.6 and priced.run_config("sim").sim.host_scale == pytest.approx(1.6)
    kept, scale = resim.at_host(setup, scales[("2x", "conversation", "0.8")])
    assert kept is setup and math.isnan(scale) and kept.run_config("sim").sim.host_scale == pytest.approx(2.5)


def _eager_prefills(tmp_path, scale: float, overrides: list[str]) -> None:
    """_kept_cell's cell with one-prompt prefills past 4,096 tokens on the prefill replica (as many as
    fleet_hosts reads a speed off), their launches scale x the eager launch fit's price, the call's
    --set being overrides."""
    table, model = _kept_cell(tmp_path, 1.0), ProfiledCostModel.load(PROFILE)
    rows = []
    for i, tokens in enumerate(range(4200, 8192, 4000 // fleet_hosts.MIN_EAGER_STEPS)):
        features = {"num_prefill_tokens": tokens, "num_decode_tokens": 0, "num_seqs": 1, "num_seeded": 0,
                    "cuda_graph": 0, "graph_batch_size": 0, "prefill_context_tokens": 0,
                    "prefill_attention_pairs": tokens * (tokens + 1) / 2, "decode_context_tokens": 0,
                    "decode_repeated_tokens": 0, "prefill_repeated_tokens": 0, "duration_s": 1.0}
        (complete,) = complete_columns(pd.DataFrame([features])).to_dict("records")
        rows.append({**table.iloc[0].to_dict(), "step": 10 + i, "prefill_tokens": tokens,
                     "launch_s": scale * model.overlap_parts(complete)[0]})
    pd.concat([table, pd.DataFrame(rows)]).to_csv(tmp_path / "steps_1P1D_conversation_0.8.csv.gz", index=False,
                                                   float_format="%.9f")
    setup = "Setup(model='qwen3-0.6b', hardware='h200', profile='/elsewhere/qwen3-0.6b.csv', overrides=())"
    (tmp_path / "settings.json").write_text(json.dumps({"setup": setup, "args": {"overrides": overrides}}))


def test_a_prefill_replicas_eager_launches_k_times_the_fit_read_k_and_price_its_pool(tmp_path):
    _eager_prefills(tmp_path, 1.6, [])
    fleet_hosts.main([str(tmp_path)])
    hosts = pd.read_csv(tmp_path / "hosts.csv", dtype={"load": str}).set_index("pool")
    # the 900-token step replays a prefill graph: not an eager launch
    assert hosts.loc["prefill", "eager_scale"] == pytest.approx(1.6, abs=1e-3)
    assert hosts.loc["prefill", "eager_steps"] == fleet_hosts.MIN_EAGER_STEPS
    assert math.isnan(hosts.loc["prefill", "host_scale"]) and hosts.loc["decode", "eager_steps"] == 0
    bound = resim.cell_host_scales(tmp_path / "hosts.csv", "prefill", "eager_scale")
    assert bound[("1P1D", "conversation", "0.8")] == pytest.approx(1.6, abs=1e-3)
    setup = Setup("qwen3-0.6b", "h200", Pools(1, 1), profile=PROFILE, prefill_host_scale=1.6)
    fleet = setup.fleet("disaggregated")
    assert fleet.prefill.host_scale == 1.6 and fleet.decode.host_scale is None


def test_a_few_eager_launches_give_no_speed(tmp_path):
    _eager_prefills(tmp_path, 1.6, [])
    table = pd.read_csv(tmp_path / "steps_1P1D_conversation_0.8.csv.gz")
    table.iloc[:-1].to_csv(tmp_path / "steps_1P1D_conversation_0.8.csv.gz", index=False, float_format="%.9f")
    hosts = fleet_hosts.fleet_hosts(tmp_path, fleet_hosts.call_profile_path(tmp_path)).set_index("pool")
    assert hosts.loc["prefill", "eager_steps"] == fleet_hosts.MIN_EAGER_STEPS - 1
    assert math.isnan(hosts.loc["prefill", "eager_scale"])


def test_prefills_a_call_replayed_as_graphs_are_not_eager(tmp_path):
    _eager_prefills(tmp_path, 1.6, ["execution.prefill_graph_tokens=8192"])
    hosts = fleet_hosts.fleet_hosts(tmp_path, fleet_hosts.call_profile_path(tmp_path)).set_index("pool")
    assert hosts.loc["prefill", "eager_steps"] == 0 and math.isnan(hosts.loc["prefill", "eager_scale"])
