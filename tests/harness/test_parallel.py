"""parallel_map on every backend, and a Hydra multirun through hydra-ray-launcher, against serial runs.

One local Ray (2 CPUs, no dashboard) serves the whole module: starting one costs seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config import CONF_DIR
from harness.convert import ConfigError
from harness.parallel import parallel_map
from harness.run import run_once
from harness.study import StudyConfig
from harness.sweeps.sweep import point_configs
from tests.harness.conftest import compose_config

REPO = CONF_DIR.parent
SWEEP_BASE = ["workload.num_requests=12", "workload.prompt_len.low=16", "workload.prompt_len.high=128",
              "workload.output_len.low=4", "workload.output_len.high=64"]
SEQS = [2, 8, 32]  # scheduler.max_num_seqs of the sweep: three different schedules


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="needs Ray: the ray extra (pip install -e '.[ray]'; dev brings it)")
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield context.address_info["gcs_address"]
    ray.shutdown()


def summary_of(rc):
    """The run's summary less the host's wall time, the one field that differs between repeats."""
    summary = dict(run_once(rc, progress=False).summary)
    del summary["wall_s"]
    return summary


def fail_on_odd(x: int) -> int:
    if x % 2:
        raise ConfigError(f"value {x} is odd")
    return 10 * x


def sweep_points():
    cfg = compose_config(SWEEP_BASE)
    study = StudyConfig(kind="sweep", param="scheduler.max_num_seqs", values=tuple(SEQS))
    return [rc for _, rc in point_configs(cfg, study)]


@pytest.fixture(scope="module")
def serial_summaries():
    return parallel_map(summary_of, sweep_points())


def test_sweep_points_differ(serial_summaries):
    # Otherwise equality across backends would prove little.
    assert len({round(s["makespan_s"], 9) for s in serial_summaries}) == len(SEQS)


def test_joblib_sweep_equals_serial(serial_summaries):
    assert parallel_map(summary_of, sweep_points(), backend="joblib", num_workers=2) == serial_summaries


def test_processes_sweep_equals_serial(serial_summaries):
    assert parallel_map(summary_of, sweep_points(), backend="processes", num_workers=2) == serial_summaries


@given(st.lists(st.integers(min_value=0, max_value=3), min_size=2, max_size=12))
@settings(max_examples=8, deadline=None)
def test_processes_keep_input_order_and_take_what_does_not_pickle(waits):
    """Items of uneven work finish out of order; fn is a closure over a lock (neither pickles):
    forked workers inherit it."""
    lock = threading.Lock()

    def slow(x: int) -> tuple[int, bool]:
        time.sleep(x / 100)
        return x, isinstance(lock, type(threading.Lock()))

    assert parallel_map(slow, waits, backend="processes", num_workers=3) == [(x, True) for x in waits]


def test_a_dead_worker_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="worker process died"):
        parallel_map(os._exit, [1, 2, 3], backend="processes", num_workers=2)


def test_ray_sweep_equals_serial(local_ray, serial_summaries):
    assert parallel_map(summary_of, sweep_points(), backend="ray", address=local_ray) == serial_summaries


@pytest.mark.parametrize("backend", ["serial", "processes", "joblib", "ray"])
def test_failure_names_the_first_failing_item(backend, request):
    if backend == "ray":
        request.getfixturevalue("local_ray")
    with pytest.raises(ConfigError, match=r"item 1 \(3\): value 3 is odd"):
        parallel_map(fail_on_odd, [2, 3, 4, 5], backend=backend)


@given(st.lists(st.integers(min_value=-10**6, max_value=10**6).map(lambda x: 2 * x), max_size=30))
@settings(max_examples=40, deadline=None)
def test_serial_map_keeps_input_order(xs):
    assert parallel_map(fail_on_odd, xs) == [10 * x for x in xs]


@pytest.mark.parametrize("kwargs, field", [
    ({"backend": "dask"}, "parallel.backend"),
    ({"backend": "joblib", "address": "10.0.0.1:6379"}, "parallel.address"),
    ({"backend": "joblib", "num_workers": 0}, "parallel.num_workers"),
    ({"backend": "ray", "num_workers": 4}, "parallel.num_workers"),
])
def test_bad_settings_are_one_line_errors(kwargs, field):
    with pytest.raises(ConfigError, match=field) as error:
        parallel_map(fail_on_odd, [2], **kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.slow  # a whole Hydra multirun on Ray; test_ray_sweep_equals_serial keeps Ray in the default suite
def test_hydra_multirun_on_ray_equals_serial(local_ray, serial_summaries, tmp_path):
    """`python -m harness -m ... hydra/launcher=ray_cluster` joins the running cluster by address."""
    command = [sys.executable, "-m", "harness", "-m", *SWEEP_BASE, "output.progress=false", "output.plots=false",
               f"scheduler.max_num_seqs={','.join(map(str, SEQS))}", "hydra/launcher=ray_cluster",
               f"hydra.launcher.ray.init.address={local_ray}", f"hydra.sweep.dir={tmp_path}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert "Connecting to existing Ray cluster" in log and "Started a local Ray instance" not in log
    for seqs, expected in zip(SEQS, serial_summaries):
        job_dir = next(Path(tmp_path).glob(f"*_scheduler.max_num_seqs={seqs},*"))
        row = pd.read_csv(job_dir / "summary.csv").iloc[0]
        for key in ("num_requests", "makespan_s", "output_tok_s", "ttft_p90_s", "tpot_p90_s", "preemptions"):
            assert row[key] == pytest.approx(expected[key], rel=1e-9), key
