"""The comparison's parts on their own: schedule diffing, step recording, profiling plans, fitting."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from engine.core import CacheConfig, Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.graph_sizes import GraphSizes, decode_graph_sizes
from engine.core.loop import WallClock, run
from engine.core.plan import KVCacheSpec, StepResult
from harness.calibration import profiling
from harness.calibration.fit import validate
from harness.calibration.grid import SHARED_KINDS
from harness.calibration.profiling import ProfileGrid, build_plan, profile_executor
from harness.compare.study import CompareConfig
from harness.compare.tables import replay, roofline_step_times, schedule_table
from harness.output.recording import StepRecorder
from sim.features import step_features
from sim.roofline import RooflineCostModel
from tests.core.fakes import FakeExecutor
from tests.sim.helpers import decode, decode_batch, hardware, model, plan, prefill
from tests.sim.test_profiled import GRAPH, true_time


def _steps(hashes, start=None):
    return pd.DataFrame({"schedule_hash": hashes, "start": start if start is not None else np.arange(len(hashes)) * 0.1,
                         "preempted": np.zeros(len(hashes), dtype=int)})


@pytest.mark.parametrize("sim, first", [
    (list("abcd"), -1),
    (list("abxd"), 2),
    (list("abc"), 3),        # a prefix of the engine's: they part where the shorter one ends
    (list("abcde"), 4),
    (list("zbcd"), 0),
])
def test_schedule_table_finds_the_first_divergent_step(sim, first):
    row = schedule_table(_steps(list("abcd")), {"sim_x": _steps(sim, np.arange(len(sim)) * 0.2)}).iloc[0]
    assert row["first_divergent_step"] == first
    assert row["schedule_identical"] == (first == -1)
    if 0 <= first < 4:
        assert row["engine_time_at_divergence_s"] == pytest.approx(0.1 * first)
    if 0 <= first < len(sim):
        assert row["sim_time_at_divergence_s"] == pytest.approx(0.2 * first)


class SleepyExecutor(FakeExecutor):
    """Really takes its time, and reports it, as the engine does."""

    def _compute(self, plan):
        start = time.perf_counter()
        result = super()._compute(plan)
        time.sleep(0.002)
        return StepResult(result.token_ids, time.perf_counter() - start)


def _recorded_wall_run(executor, max_tokens: int):
    """Four requests 40 ms apart served on the wall clock through a StepRecorder; checks that the
    recorded host time, the step durations and the sleep add up to the makespan."""
    sched = make_scheduler(SchedulerConfig(max_model_len=256), executor.info(), CacheConfig(16, 64))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    requests = [Request(f"r{i}", list(range(1, 30)), params, arrival_time=0.04 * i) for i in range(4)]
    recorder = StepRecorder((), wall=True)
    executor.observe(recorder)
    clock = recorder.watch(WallClock())
    result = run(sched, executor, requests, clock)
    frame = recorder.frame()
    assert len(frame) == len(result.steps) and (frame["host_s"] >= 0).all()
    assert recorder.asleep_s > 0.05  # the requests arrive 40 ms apart and each takes ~10 ms
    accounted = sum(s.duration_s for s in result.steps) + frame["host_s"].sum() + recorder.asleep_s
    assert 0 <= result.makespan_s - accounted < 0.01
    # each sleep is the one before a step: the first request's, then each later arrival's
    assert abs(frame["slept_s"].sum() - recorder.asleep_s) < 1e-9 and (frame["slept_s"] > 0).sum() >= 3
    return result, frame


def test_recorded_host_time_and_sleep_account_for_the_wall_clock():
    result, frame = _recorded_wall_run(SleepyExecutor(64, 16), max_tokens=4)
    assert frame["num_decode_tokens"].sum() == sum(s.stats.num_decode_tokens for s in result.steps)


class QueuedDevice(FakeExecutor):
    """Overlapped steps on a pretend device: each step occupies it 3 ms from the later of its
    submission and the previous step's end; result() sleeps until the step's end."""

    overlaps_steps = True

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.free_at: float | None = None

    def submit(self, plan):
        return self.hooks.submitted(plan, self._queue)

    def _queue(self, plan):
        now = time.perf_counter()
        start = now if self.free_at is None else max(now, self.free_at)
        idle = 0.0 if self.free_at is None else start - self.free_at
        self.free_at = end = start + 0.003
        tokens = self._compute(plan).token_ids

        class Pending:
            def result(self):
                time.sleep(max(0.0, end - time.perf_counter()))
                return StepResult(tokens, end - start, idle)

        return Pending()


def test_recorded_host_time_of_overlapped_steps_is_the_device_idle_time_less_sleep():
    _, frame = _recorded_wall_run(QueuedDevice(64, 16), max_tokens=6)
    assert frame["launch_s"].notna().all()  # submit() was timed
    # back-to-back decode steps were queued before the device finished the previous one
    assert (frame["host_s"] < 1e-3).mean() > 0.5


def test_the_loops_own_work_between_overlapped_launches_is_loop_s_not_launch_s():
    """Work the loop does per step outside submit() (here 2 ms in the step hook, as a server's
    hand-off would) shows in loop_s, and launches plus loop plus sleep account for the wall clock
    up to the last submit()'s return."""
    returns: list[float] = []

    class Timed(QueuedDevice):
        def _queue(self, plan):
            pending = super()._queue(plan)
            returns.append(time.perf_counter())
            return pending

    executor = Timed(64, 16)
    sched = make_scheduler(SchedulerConfig(max_model_len=256), executor.info(), CacheConfig(16, 64))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    requests = [Request(f"r{i}", list(range(1, 30)), params, arrival_time=0.04 * i) for i in range(3)]
    recorder = StepRecorder((), wall=True)
    executor.observe(recorder)
    began = time.perf_counter()
    clock = recorder.watch(WallClock())
    run(sched, executor, requests, clock, on_step=lambda record, finished: time.sleep(0.002))
    frame = recorder.frame()
    assert frame["loop_s"].notna().all() and (frame["launch_s"] < 2e-3).all()
    # between two submits the loop reads one step's result (its hook: 2 ms), except right after a
    # step submitted with nothing in flight
    assert (frame["loop_s"] >= 2e-3).mean() > 0.6 and frame["loop_s"].median() < 0.02
    accounted = frame["launch_s"].sum() + frame["loop_s"].sum() + recorder.asleep_s
    assert 0 <= returns[-1] - began - accounted < 2e-3


def test_steps_not_overlapped_have_no_loop_s():
    _, frame = _recorded_wall_run(SleepyExecutor(64, 16), max_tokens=3)
    assert "loop_s" not in frame.columns and "launch_s" not in frame.columns


def test_a_replayed_step_after_a_sleep_has_no_predecessor_to_hide_behind():
    """The loop sleeps only with nothing in flight, so the replay prices such a step after an idle
    device (previous duration 0: its whole lead), as the simulator does after drained()."""
    seen = {}

    class Pricer:
        def predict(self, table, include_host=False):
            seen["previous"] = table["previous_duration_s"].tolist()
            return np.full(len(table), 1e-3)

    steps = pd.DataFrame({"step": range(4), "kind": ["prefill", "decode", "prefill", "decode"],
                          "num_seqs": 1, "num_tokens": [9, 1, 9, 1], "cuda_graph": 1,
                          "duration": [2e-3, 1e-3, 3e-3, 1e-3], "host_s": 0.0,
                          "slept_s": [0.0, 0.0, 0.05, 0.0]})
    out = replay(steps, {"profiled": Pricer()})
    previous = seen["previous"]
    assert np.isnan(previous[0]) and previous[1] == 2e-3 and previous[2] == 0.0 and previous[3] == 3e-3
    assert np.allclose(out["predicted_profiled_s"], 1e-3)


def test_roofline_from_features_equals_its_step_time():
    roof = RooflineCostModel(model("qwen3-0.6b"), hardware("h100"))
    plans = [decode_batch([100, 2000, 37]), plan(prefill(500, 0, rid="a"), prefill(300, 1200, rid="b")),
             plan(prefill(64, 256), decode(900, rid="d1"), decode(10, rid="d2")), plan(prefill(200, 0, sample=False))]
    # a step whose sequences read 512 KV tokens again (a shared prefix), 256 of them by decodes
    repeats = dataclasses.replace(plans[2].stats, repeated_kv_tokens=512, decode_repeated_kv_tokens=256)
    plans.append(dataclasses.replace(plans[2], stats=repeats))
    features = pd.DataFrame([step_features(p, GRAPH) for p in plans])
    assert roofline_step_times(roof, features) == pytest.approx([roof.step_time(p) for p in plans], rel=1e-12)
    assert roofline_step_times(roof, features)[-1] < roofline_step_times(roof, features)[2]
    old = features.drop(columns=["decode_repeated_tokens", "prefill_repeated_tokens"])  # a table from before
    assert roofline_step_times(roof, old)[:-1] == pytest.approx(roofline_step_times(roof, features)[:-1], rel=1e-12)


def test_profile_plans_respect_budgets_and_share_only_prefix_blocks():
    sched = SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=4096)
    spec = KVCacheSpec(num_blocks=800, block_size=16)
    rng = np.random.default_rng(0)
    built, shared = 0, 0
    for _, kind, entries in ProfileGrid().shapes(sched, rng):
        step = build_plan(entries, spec, sched, rng, vocab_size=500)
        if step is None:
            continue
        built += 1
        blocks = [b for e in step.scheduled for b in e.block_table]
        assert max(blocks) < spec.num_blocks
        # a block two entries hold lies in both their cached contexts (nothing writes it), and
        # the stats count its repeats
        written = [e.block_table[p // 16] for e in step.scheduled for p in range(e.num_computed_tokens, e.context_len)]
        repeats = [b for b, n in Counter(blocks).items() if n > 1]
        assert not set(written) & set(repeats)
        assert step.stats.repeated_kv_tokens == 16 * (len(blocks) - len(set(blocks)))
        assert (kind in SHARED_KINDS) >= bool(repeats)
        shared += bool(repeats)
        assert len(step.scheduled) <= sched.max_num_seqs and step.num_tokens <= sched.max_num_batched_tokens
        for e in step.scheduled:
            assert len(e.block_table) * 16 >= e.context_len and e.context_len <= sched.max_model_len
            assert max(e.token_ids) < 500
            assert not (e.is_decode and (kind == "prefill" or len(e.token_ids) != 1))
    assert built > 50 and shared >= 10
    assert build_plan([(1, 16000, True)], spec, sched, rng, 500) is None  # more blocks than the pool


class GraphExecutor(FakeExecutor):
    """Replays decode graphs up to 16 sequences; records whether each step was allowed to."""

    def __init__(self):
        super().__init__(4000, 16)
        self._info = dataclasses.replace(self._info, graph_sizes=GraphSizes(decode_graph_sizes(16, 16)))
        self.with_graphs = []

    def execute(self, plan):
        self.with_graphs.append(plan.use_cuda_graphs)
        return super().execute(plan)


def test_profile_times_decodes_with_and_without_graphs():
    grid = ProfileGrid(prefill_tokens=(64,), prefill_seqs=(1,), prefill_contexts=(0,), decode_batches=(4, 8),
                       decode_contexts=(100,), eager_decode_batches=(8,), mixed_prefill_tokens=(), num_random=0,
                       shared_prefix_tokens=(), num_random_shared=0, warmup=1, repeats=3, min_repeats=3)
    executor = GraphExecutor()
    rows = profile_executor(executor, SchedulerConfig(max_model_len=1024), grid)
    assert list(rows["kind"]) == ["prefill", "decode", "decode", "decode"]
    assert list(rows["cuda_graph"]) == [0, 1, 1, 0]  # batch 8 also eager
    assert list(rows["num_seqs"]) == [1, 4, 8, 8]
    assert executor.with_graphs == [True] * 12 + [False] * 4  # only the eager batch-8 repeats bypass graphs
    assert (rows["repeats"] == 3).all() and len(executor.plans) == 4 * (1 + 3)
    fake = 1e-3 * (1 + rows["num_tokens"] / 1000)  # FakeExecutor's reported duration
    assert rows["duration_s"].to_numpy() == pytest.approx(fake.to_numpy())


@pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")  # random shapes may poke out of the grid
def test_validation_of_a_noiseless_law_has_small_held_out_errors():
    rng = np.random.default_rng(1)
    rows = []
    sched = SchedulerConfig()
    for shape_set, _, entries in ProfileGrid().shapes(sched, rng):
        step = build_plan(entries, KVCacheSpec(100000, 16), sched, rng, 1000)
        if step is not None:
            f = step_features(step, GRAPH)
            rows.append({**f, "set": shape_set, "duration_s": true_time(f)})
    profile = pd.DataFrame(rows)
    real = profile[profile["set"] == "random"].drop(columns=["set"]).rename(columns={"duration_s": "duration"})
    real = real.assign(host_s=1e-4 + 1e-6 * real["num_seqs"], step=np.arange(len(real)))
    fitted, table = validate(profile, real, GRAPH)
    assert set(table["set"]) == {"grid_split", "random_shapes", "real_steps"}
    overall = table[table["regime"] == "all"].set_index("set")
    assert (overall["median_abs_rel_error"] < 0.02).all()
    assert fitted.has_host


@pytest.mark.parametrize("kwargs, field", [
    ({"cost_models": ("exact",)}, "compare.cost_models"),
    ({"grid": "huge"}, "compare.grid"),
    ({"engine_dir": "x"}, "compare.profile_path"),
    ({"throughput_tol": 0}, "compare.throughput_tol"),
])
def test_compare_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CompareConfig(**kwargs)


class _VirtualDevice:
    """An overlapping executor on a virtual clock: submit() costs `host` of host time before the
    device can start, the device runs `gpu`, and the tokens reach the host `tail` after it ends."""

    host, gpu, tail = 0.002, 0.005, 0.0007

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def submit(self, plan):
        self.clock[0] += self.host
        return self

    def result(self) -> StepResult:
        self.clock[0] += self.gpu + self.tail
        return StepResult([0], self.gpu, 0.0, self.tail)

    def execute(self, plan) -> StepResult:
        return self.submit(plan).result()

    def hold_device(self, seconds: float) -> bool:
        return True


def test_lead_is_the_host_time_before_the_device_not_the_wait_for_the_tokens(monkeypatch):
    # A served run stamps a token when the device is done with it (ready_age_s), so the lead a
    # step after an idle gap pays ends there: host time before the device starts, not the copy out.
    clock = [0.0]
    monkeypatch.setattr(profiling.time, "perf_counter", lambda: clock[0])
    device = _VirtualDevice(clock)
    timing = profiling.time_plan_overlapped(device, None, ProfileGrid(warmup=1, repeats=3, min_repeats=3))
    assert timing.gpu_s == pytest.approx(device.gpu)
    assert timing.lead_s == pytest.approx(device.host)
