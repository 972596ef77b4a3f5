"""experiments/serve/ttft_band.py: each server's client TTFT around its median, from aiperf's
records; a median in the gap between two groups shows a wide band while the mean stays put, and
a case without records is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.serve import aiperf, ttft_band


def write_records(folder: Path, case: str, ttft_ms: list[float]) -> None:
    out = folder / f"aiperf_{case}"
    out.mkdir(parents=True)
    lines = [json.dumps({"metadata": {"request_start_ns": i},
                         "metrics": {"time_to_first_token": {"value": t}, "inter_token_latency": {"value": 2.0},
                                     "usage_prompt_tokens": {"value": 10}, "output_sequence_length": {"value": 5}}})
             for i, t in enumerate(ttft_ms)]
    (out / aiperf.RECORDS).write_text("\n".join(lines) + "\n")


def test_a_median_between_two_groups_has_a_wide_band_and_an_even_spread_a_narrow_one(tmp_path):
    two_groups = [40.0 + i * 0.01 for i in range(50)] + [60.0 + i * 0.01 for i in range(50)]
    even = list(np.linspace(49.0, 51.0, 100))
    for server, ttfts in (("engine_server", two_groups), ("sim_server", even)):
        write_records(tmp_path / server, "mooncake_50", ttfts)
    table = ttft_band.bands({s: tmp_path / s for s in ("engine_server", "sim_server")}, None).set_index("server")
    gap, flat = table.loc["engine_server"], table.loc["sim_server"]
    assert gap["ttft_p45_ms"] < 41 and gap["ttft_p55_ms"] > 59  # the middle request decides the P50
    assert gap["band_pct"] > 30 and flat["band_pct"] < 2
    assert gap["ttft_mean_ms"] == pytest.approx(flat["ttft_mean_ms"], rel=0.01)


def test_a_case_without_records_is_one_line(tmp_path):
    write_records(tmp_path / "engine_server", "azure_50", [8.0, 9.0])
    write_records(tmp_path / "sim_server", "azure_50", [8.0, 9.0])
    with pytest.raises(SystemExit, match="no aiperf records for \\['mooncake_80'\\]"):
        ttft_band.bands({s: tmp_path / s for s in ("engine_server", "sim_server")}, ["mooncake_80"])
