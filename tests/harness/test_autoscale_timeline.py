"""timeline.csv: each window's rates and mean replicas are over the time it covers, so the window
the run ends in reads like the others and the replicas integrate to the billed GPU-hours."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.elastic_states import Lifetime
from harness.autoscale.config import SLO
from harness.autoscale.timeline import STATES, gpu_hours, timeline


def _requests(arrivals: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"arrival": arrivals, "ttft": 0.1, "tpot": 0.01})


def _steps() -> pd.DataFrame:
    return pd.DataFrame({"start": [0.0], "free_blocks": [10]})


def test_the_window_the_run_ends_in_reads_its_own_span():
    # two replicas serve from 0 to 90 s at 10 req/s: the 60-120 s window covers 60-90 s of the run
    arrivals = np.arange(0.0, 90.0, 0.1)
    lives = [Lifetime(i, 0.0, 0.0, stop_s=90.0) for i in range(2)]
    frame = timeline(_requests(arrivals), _steps(), lives, 20, 60.0, 90.0, SLO())
    assert frame["end_s"].iloc[-1] == pytest.approx(90.0)
    assert frame["serving"].to_numpy() == pytest.approx([2.0, 2.0])
    assert frame["arrival_rate"].to_numpy() == pytest.approx([10.0, 10.0], rel=0.02)


@settings(max_examples=15, deadline=None)
@given(end=st.floats(1.0, 500.0), window=st.floats(5.0, 120.0),
       spans=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0)), min_size=1,
                      max_size=4))
def test_the_timeline_integrates_to_the_billed_gpu_hours(end, window, spans):
    lives = []
    for i, parts in enumerate(spans):
        requested, ready, stop = sorted(p * end for p in parts)
        lives.append(Lifetime(i, requested, ready, stop_s=stop))
    frame = timeline(_requests(np.array([0.0])), _steps(), lives, 20, window, end, SLO())
    widths = (frame["end_s"] - frame["start_s"]).to_numpy()
    replicas = frame[list(STATES)].sum(axis=1).to_numpy()
    assert frame["end_s"].iloc[-1] == pytest.approx(end)
    assert (replicas * widths).sum() / 3600.0 == pytest.approx(gpu_hours(lives, 1), abs=1e-12)
    assert (replicas <= len(lives) + 1e-9).all()


def test_the_plot_shows_every_window_with_readable_axes(tmp_path):
    from harness.autoscale.plots import plot_autoscale

    arrivals = np.arange(0.0, 90.0, 0.1)
    lives = [Lifetime(0, 0.0, 0.0, stop_s=90.0), Lifetime(1, 60.0, 70.0, stop_s=90.0)]
    requests = _requests(arrivals).assign(ttft=np.linspace(0.004, 0.03, len(arrivals)))
    frame = timeline(requests, _steps(), lives, 20, 60.0, 90.0, SLO())
    row = {"autoscale_policy": "queue", "model": "m", "hardware": "h", "workload": "w", "gpu_hours": 0.04,
           "cost": 0.12, "slo_attainment": float("nan")}
    fig = plot_autoscale(frame, SimpleNamespace(to_row=lambda: row), SLO(), tmp_path / "autoscale.png")
    load, _, ttft, _, replicas = fig.axes[:5]
    # the last window (60-90 s, two replicas) is drawn to its end, not cut at its start
    stacked = np.concatenate([p.get_paths()[0].vertices for p in replicas.collections])
    assert stacked[:, 0].max() == pytest.approx(90.0) and load.get_xlim()[1] >= 90.0
    assert stacked[stacked[:, 0] > 60.0, 1].max() == pytest.approx(2.0)
    labels = [t.get_text() for t in ttft.get_yticklabels(which="both") if t.get_text()]
    assert len(labels) >= 2 and all("times" not in t and "^" not in t for t in labels), labels
    assert "nan" not in fig.get_suptitle()
