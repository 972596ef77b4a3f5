"""experiments/fidelity/small_batch_decode_probe.py's reading of its timings (the GPU part runs on
a device call)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "fidelity" / "small_batch_decode_probe.py"


def _probe():
    spec = importlib.util.spec_from_file_location("small_batch_decode_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slopes_are_per_context_token_of_the_whole_batch():
    probe = _probe()
    rows = [{"batch": b, "context": c, "span_s": 1e-3 + per_token * b * c}
            for b, per_token in ((1, 1.4e-7), (8, 3.1e-8)) for c in (512, 2048, 8000)]
    table = probe.slopes(pd.DataFrame(rows)).set_index("batch")
    assert table.loc[1, "s_per_context_token"] == pytest.approx(1.4e-7)
    assert table.loc[8, "s_per_context_token"] == pytest.approx(3.1e-8)
    assert table.loc[8, "span_at_shortest_ms"] == pytest.approx(1.0 + 1e3 * 3.1e-8 * 8 * 512)


def test_the_merge_fit_recovers_a_price_per_merged_split_and_per_context_token():
    probe = _probe()
    rows = []
    for batch, base in ((1, 1.4e-3), (2, 1.41e-3), (8, 1.43e-3), (32, 1.79e-3)):
        for context in (512, 2048, 4096, 8000):
            used = int(probe.QWEN3_06B_H200.used_splits([context] * batch, (batch, 8192)).max())
            rows.append({"batch": batch, "context": context,
                         "span_s": base + 9e-6 * (used if used > 1 else 0) + 2.6e-8 * batch * context})
    fitted, per_split, per_token = probe.merge_fit(pd.DataFrame(rows))
    assert per_split == pytest.approx(9e-6) and per_token == pytest.approx(2.6e-8)
    assert fitted["err"].abs().max() < 1e-9
    plain, none, _ = probe.merge_fit(pd.DataFrame(rows), with_merge=False)
    assert none == 0.0 and plain["err"].abs().max() > 0.05
