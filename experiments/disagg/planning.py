"""`run_disagg.py plan`: the planner's direction on each scenario, which `goodput`
(experiments/disagg/goodput.py) then confirms on the engine.

experiment=plan 'plan.modes=[aggregated,disaggregated]' on each scenario (workloads.SCENARIOS) with
the call's GPU type, priced by its profile; plan_<scenario>/ holds plan.csv and plan_summary.csv.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.disagg.common import Setup
from experiments.disagg.workloads import CPU_LENGTH_SCALE, GOODPUT_MAX_MODEL_LEN, PLAN_SPACE, Scenario
from harness.scripting import compose_config

CPU_PLAN = ("scheduler.max_model_len=512", "cache.block_size=16", "plan.max_replicas=2",
            "plan.disagg_max_pool_replicas=1", "plan.disagg_max_evals=1")


def plan(setup: Setup, scenario: Scenario, out: Path) -> dict:
    """The planner on the scenario: each mode's cheapest deployment meeting the SLO, and the winner."""
    from harness.study import run_study

    scale = CPU_LENGTH_SCALE if setup.cpu else 1.0
    w = scenario.workload(scenario.rate, scenario.plan_requests, scale)
    # CPU runs (tests): the planner's mechanics only, on an H100's figures (the CPU entry has no link)
    # and a search cut to a few fleets
    hardware = "h100" if setup.cpu else setup.hardware
    overrides = [*PLAN_SPACE, f"model={setup.model}", f"hardware={hardware}", f"plan.hardware=[{hardware}]",
                 f"workload.num_requests={w.num_requests}", f"workload.rate={scenario.rate}",
                 f"workload.prompt_len.low={w.prompt_len.low}", f"workload.prompt_len.high={w.prompt_len.high}",
                 f"workload.output_len.low={w.output_len.low}", f"workload.output_len.high={w.output_len.high}",
                 f"slo.ttft_p90_s={scenario.ttft_s}", f"slo.tpot_p90_s={scenario.tpot_s}",
                 *(CPU_PLAN if setup.cpu else GOODPUT_MAX_MODEL_LEN),
                 *(("backend.cost_model=profiled", f"backend.profile_path={setup.profile}") if setup.profile else ()),
                 f"hydra.run.dir={out}"]
    out.mkdir(parents=True, exist_ok=True)
    run_study(compose_config(overrides), out)
    summary = pd.read_csv(out / "plan_summary.csv").iloc[0]
    return {"scenario": scenario.name, "expected": scenario.expected, "winner": summary.get("winner", ""),
            "aggregated": summary.get("aggregated_deployment", ""),
            "disaggregated": summary.get("disaggregated_deployment", "")}
