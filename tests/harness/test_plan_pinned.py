"""What made deployment evaluations faster changes no result: six deployments give the plan.csv
numbers they gave before (recorded at commit 0c4f729: every latency percentile, throughput and SLO
verdict; both policies, overlapped (TP 1) and plain (TP 2) steps, every router, 1-3 replicas,
prefix-cache hits and, on a cache of 24 blocks, preemptions; the TP 2 rows re-recorded when the
ranks stopped gathering the logits to sample, sim.roofline_comm.gathers_logits); an evaluation makes
no reference cycles (the cycle collector is paused for it); a step table of some columns is
those columns of the whole table."""

from __future__ import annotations

import gc
import hashlib
import logging

import pandas as pd
import pytest

from engine.core import make_scheduler
from engine.core.loop import SimulatedClock, run
from engine.core.routers import RouterConfig
from harness.output.metrics import STEP_COLUMNS, SUMMARY_STEP_COLUMNS, steps_frame
from harness.plan.config import SLOConfig, load_catalogue
from harness.plan.evaluate import PlanBase, evaluate
from harness.plan.row import Deployment
from harness.run import cyclic_gc_paused, make_executor
from harness.scripting import compose_run_config
from harness.workloads import build_workload

WORKLOAD = ["experiment=plan", "workload=shared_prefix", "workload.num_requests=150", "workload.rate=30",
            "workload.shared_prefix.fraction=0.5", "output.progress=false"]
TIGHT = "cache.num_blocks=24"
# the h200 TP 2 row was pinned before the one-shot all-reduce existed; "auto" now prices it there
RING = "execution.all_reduce=nccl"
CASES = {
    "nano-rr-1": ("", Deployment("h100", 1, 64, 2048, "nano", "round_robin", 1)),
    "mixed-tokens-2": ("", Deployment("h100", 1, 64, 2048, "mixed", "least_tokens", 2)),
    "nano-requests-3-tp2": ("", Deployment("a100", 2, 32, 1024, "nano", "least_requests", 3)),
    "mixed-affinity-2-tp2": (RING, Deployment("h200", 2, 128, 4096, "mixed", "prefix_affinity", 2)),
    "mixed-rr-1-preempting": (TIGHT, Deployment("h100", 1, 64, 2048, "mixed", "round_robin", 1)),
    "nano-tokens-2-tp2-preempting": (TIGHT, Deployment("a100", 2, 64, 2048, "nano", "least_tokens", 2)),
}
PINNED_COLUMNS = tuple(f"{m}_p{p}_s" for m in ("ttft", "tpot", "e2e") for p in (50, 90, 99)) + (
    "output_tok_s", "request_s", "num_rejected", "slo_ratio", "meets_slo", "error")
EXPECTED = {
    "nano-rr-1": (
        0.4590901670774701, 1.7362519428899412, 1.8306705533185959, 0.015483439578006252, 0.01658412546078184,
        0.017312715426785027, 3.465785739520112, 4.4705657449324345, 4.8075966922360704, 3142.28414466919,
        16.911579121681264, 0, 1.7362519428899412, False, "",
    ),
    "mixed-tokens-2": (
        0.0363053111250593, 0.05053761835452254, 0.060997964398385694, 0.009437378880358352,
        0.010170187544060265, 0.010755211719174252, 1.6805649098245927, 2.5581639551235833, 2.917972990269486,
        4095.598098398229, 22.042255920481303, 0, 0.20340375088120527, True, "",
    ),
    "nano-requests-3-tp2": (
        0.054278432601289894, 0.06889798506263442, 0.09721461108466768, 0.0104812298840668, 0.012009830813385261,
        0.013610601626746509, 1.7896255424540364, 2.9599302996929633, 3.2995581134643674, 4130.24973745666,
        22.228748900954365, 0, 0.24019661626770522, True, "",
    ),
    "mixed-affinity-2-tp2": (
        0.02505613603274115, 0.03969498433111917, 0.059944803853983625, 0.004851798508928174, 0.005316044705991412,
        0.005976897443457105, 0.8998493825132812, 1.3896105955959646, 1.506028492126562, 4715.735895327212,
        25.379799228555914, 0, 0.10632089411982823, True, "",
    ),
    "mixed-rr-1-preempting": (
        22.48924852259289, 40.507190034124, 44.76239732280386, 0.006626798823040881, 0.007719873704270207,
        0.011412039277314516, 23.62458033584133, 42.265845640673305, 46.09486190000455, 543.9366606384343,
        2.9274335006194665, 0, 40.507190034124, False, "",
    ),
    "nano-tokens-2-tp2-preempting": (
        10.006905385389661, 18.30755165673006, 20.722190976070983, 0.006886087198585398, 0.007944659708091124,
        0.012152801340189534, 10.862457678465935, 20.307032629235454, 22.071094038143926, 1023.2510681922455,
        5.507074027800826, 0, 18.30755165673006, False, "",
    ),
}


def evaluate_cases() -> dict[str, dict]:
    logging.disable(logging.WARNING)  # the clipping notice of the workload
    try:
        bases = {extra: PlanBase(compose_run_config(WORKLOAD + ([extra] if extra else [])),
                                 load_catalogue(("a100", "h100", "h200")), SLOConfig(), RouterConfig())
                 for extra in {extra for extra, _ in CASES.values()}}
        return {key: evaluate(d, bases[extra]) for key, (extra, d) in CASES.items()}
    finally:
        logging.disable(logging.NOTSET)


@pytest.fixture(scope="module")
def rows():
    return evaluate_cases()


# Seconds and rates to 9 significant digits: the same schedule priced on another machine or numpy
# may differ in the last bits of a sum or a percentile's interpolation (an ulp is ~2e-16 relative),
# while any change of a decision or a price moves them by far more than 1e-9. Counts, verdicts and
# errors are compared exactly.
FLOAT_REL = 1e-9


def pinned(values: tuple) -> tuple:
    return tuple(pytest.approx(v, rel=FLOAT_REL, abs=0.0) if isinstance(v, float) else v for v in values)


@pytest.mark.parametrize("key", CASES)
def test_a_deployment_gives_the_pinned_plan_row(rows, key):
    got = tuple(rows[key][c] for c in PINNED_COLUMNS)
    assert [type(v) is float for v in EXPECTED[key]] == [isinstance(v, float) for v in got]
    assert got == pinned(EXPECTED[key])


def test_an_evaluation_leaves_no_reference_cycles():
    """harness.run.cyclic_gc_paused turns the cycle collector off for simulations: sound only as
    long as the loop frees its garbage by reference counting alone."""
    extra, deployment = CASES["mixed-rr-1-preempting"]
    base = PlanBase(compose_run_config(WORKLOAD + [extra]), load_catalogue(("h100",)), SLOConfig(), RouterConfig())
    while gc.collect():  # what earlier tests left, and what their finalizers leave in turn
        pass
    gc.disable()
    try:
        evaluate(deployment, base)
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cycle_collector_is_left_as_it_was(enabled):
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(RuntimeError):
            with cyclic_gc_paused():
                assert not gc.isenabled()
                raise RuntimeError
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


def test_a_step_table_of_some_columns_is_those_columns_of_the_whole_table():
    rc = compose_run_config(WORKLOAD + ["workload.num_requests=20", TIGHT])
    executor = make_executor(rc)
    info = executor.info()
    requests = build_workload(rc.workload, rc.scheduler.max_model_len, info.vocab_size).requests
    result = run(make_scheduler(rc.scheduler, info, rc.cache), executor, requests, SimulatedClock())
    whole = steps_frame(result)
    fields = ("step", "start_s", "duration_s", "kind", "num_requests", "num_prefill_tokens", "num_decode_tokens",
              "num_waiting", "num_running", "num_free_blocks", "num_preempted", "prefix_hit_tokens",
              "repeated_kv_tokens")
    expected = pd.DataFrame([[getattr(s, f) if hasattr(s, f) else getattr(s.stats, f) for f in fields]
                             for s in result.steps], columns=list(STEP_COLUMNS))
    pd.testing.assert_frame_equal(whole, expected)
    assert whole["preempted"].sum() > 0 and whole["prefix_hit_tokens"].sum() > 0
    for columns in (SUMMARY_STEP_COLUMNS, ("kind", "start")):
        pd.testing.assert_frame_equal(steps_frame(result, columns), whole[list(columns)])


def test_the_simulator_samples_the_tokens_it_sampled_before():
    """The simulated tokens (a hash of seed, request and position), preempted requests included:
    sha256 over every request's ids, recorded at commit 0c4f729."""
    digest = hashlib.sha256()
    for tp in (1, 2):  # overlapped steps, then plain ones
        rc = compose_run_config(["model=qwen3-8b", "workload=shared_prefix", "workload.num_requests=60", TIGHT,
                                 f"execution.tensor_parallel_size={tp}", "output.progress=false"])
        executor = make_executor(rc)
        info = executor.info()
        requests = build_workload(rc.workload, rc.scheduler.max_model_len, info.vocab_size).requests
        result = run(make_scheduler(rc.scheduler, info, rc.cache), executor, requests, SimulatedClock())
        assert sum(r.num_preemptions for r in result.requests) > 0
        for request in result.requests:
            digest.update(repr(request.token_ids).encode())
    assert digest.hexdigest() == "3ed20dc8c4c1955e154343c1a6571b564062042df63f058ad041204bdeb709db"
