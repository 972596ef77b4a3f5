"""The power curve's tools (experiments/fidelity/power_curve.py, power_curve_h200/summary.py): the
shipped curves are what the tool makes of the committed probe summaries, and the cells' summary
counts what it says."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.fidelity import power_curve
from experiments.fidelity.power_curve_h200 import summary

REPO = Path(__file__).resolve().parents[1]
FIDELITY = REPO / "experiments" / "fidelity"


@pytest.mark.parametrize("shipped, probes, shapes, model", [
    ("qwen3-0.6b.power.json", ["prefill_rate_h200/summary.csv", "prefill_rate_h200_shapes/summary.csv"],
     ["eager prefill 6 x 2560", "prefill 6 x 2560", "prefill 12 x 1280"], "qwen3-0.6b"),
    ("qwen3-8b.power.json", ["prefill_rate_h200/summary_8b.csv"], ["graph prefill 3072"], "qwen3-8b"),
])
def test_the_shipped_curves_are_the_tools_output_of_the_committed_probes(tmp_path, shipped, probes, shapes, model):
    out = tmp_path / "curve.json"
    assert power_curve.main([*(str(FIDELITY / p) for p in probes), "--shape", *shapes, "--model", model,
                             "--hardware", "H200-SXM-141GB", "--out", str(out)]) == 0
    made, committed = json.loads(out.read_text()), json.loads((REPO / "profiles" / "h200" / shipped).read_text())
    assert {k: v for k, v in made.items() if k != "command"} == {k: v for k, v in committed.items() if k != "command"}


def test_series_pool_by_rate_into_non_decreasing_factors_and_hold_the_last_decode():
    one = pd.DataFrame({"shape": ["s"] * 3 + ["other"], "prefill_k_tokens_per_s": [300.0, 100.0, 200.0, 50.0],
                        "prefill_span_ms": [12.0, 10.0, 11.0, 1.0], "decode_span_ms": [float("nan"), 2.0, 2.2, 1.0]})
    curve = power_curve.curve_of([one], ["s"], "m", "h", 1.0, "cmd")
    assert curve.prefill_tokens_per_s == (0.0, 100e3, 200e3, 300e3)
    assert curve.prefill_scale == (1.0, 1.0, 1.1, 1.2) and curve.decode_scale == (1.0, 1.0, 1.1, 1.1)
    # another machine's series, slower at 150 k than the first at 200 k: the two pooled to their mean
    two = pd.DataFrame({"shape": ["s", "s"], "prefill_k_tokens_per_s": [50.0, 150.0], "prefill_span_ms": [5.0, 6.0],
                        "decode_span_ms": [1.0, 1.0]})
    pooled = power_curve.curve_of([one, two], ["s"], "m", "h", 1.0, "cmd")
    assert pooled.prefill_tokens_per_s == (0.0, 50e3, 100e3, 150e3, 200e3, 300e3)
    assert pooled.prefill_scale == (1.0, 1.0, 1.0, 1.15, 1.15, 1.2)
    assert power_curve.non_decreasing([1.0, 3.0, 2.0, 4.0, 0.0]) == [1.0, 2.25, 2.25, 2.25, 2.25]
    with pytest.raises(ValueError, match="no mixes of shape 'x' in any summary"):
        power_curve.curve_of([one], ["x"], "m", "h", 1.0, "cmd")
    assert power_curve.gpu_of("H100-SXM5-80GB") == ("GH100", 700.0)
    with pytest.raises(ValueError, match="--hardware B300: no conf/hardware entry has that name"):
        power_curve.gpu_of("B300")


def test_the_cells_summary_counts_loaded_cells_within_the_bound_each_way(tmp_path, capsys):
    def table(errs: list[float]) -> pd.DataFrame:
        rows = [{"load": load, "metric": metric, "err": err / 100}
                for (load, metric), err in zip([(0.5, m) for m in summary.METRICS] + [("offline", "request_s")], errs)]
        return pd.DataFrame(rows)
    table([5, -12, 9.9, 30, 4]).to_csv(tmp_path / "s1_without.csv", index=False)
    table([5, -8, 11, 3, 1]).to_csv(tmp_path / "s1_with.csv", index=False)
    assert summary.main([str(tmp_path), "--out", str(tmp_path / "out.csv")]) == 0
    assert "all samples: 2 -> 3 of 4" in capsys.readouterr().out
    written = pd.read_csv(tmp_path / "out.csv")
    assert set(written["side"]) == {"with", "without"} and len(written) == 10
    assert summary.main([str(tmp_path / "empty"), "--out", str(tmp_path / "o.csv")]) == 1


def test_the_probe_takes_prefill_shapes_by_prompts_and_tokens_and_names_a_bad_one():
    import importlib.util

    spec = importlib.util.spec_from_file_location("probe", REPO / "experiments" / "fidelity" / "prefill_rate_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.prefill_shapes(None) == probe.PREFILLS
    assert probe.prefill_shapes(["3x2000", "1X2048"]) == {"prefill 3 x 2000": [(2000, 0, False)] * 3,
                                                        "prefill 1 x 2048": [(2048, 0, False)]}
    for bad in ("3x", "0x100", "three x 2"):
        with pytest.raises(ValueError, match=f"'{bad}' is not PROMPTSxTOKENS"):
            probe.prefill_shapes([bad])


def test_clock_segments_cuts_the_samples_at_idle_gaps_and_counts_the_limit(tmp_path, capsys):
    from experiments.fidelity import clock_segments

    lines = []
    for i in range(200):  # 20 s at 10 Hz: busy, idle for 6 s, busy again
        t = i * 0.1
        w, mhz = (695.0, 1500) if t < 5 else (100.0, 1980) if t < 11 else (400.0 if i % 2 else 700.0, 1800)
        lines.append(f"2026/11/29 12:00:{int(t):02d}.{int(round(t % 1 * 1000)):03d}, {mhz}, {w}, 50")
    path = tmp_path / "clocks.csv"
    path.write_text("\n".join(lines) + "\n")
    table = clock_segments.stretches(clock_segments.read_samples(path), 700.0)
    assert list(table["at_limit"]) == [1.0, 0.5] and list(table["mean_mhz"]) == [1500, 1800]
    assert table["start_s"].iloc[1] == pytest.approx(11.0) and table["seconds"].iloc[0] == pytest.approx(4.9)
    assert clock_segments.main([str(path), "--limit-w", "700", "--labels", "a"]) == 1
    assert "1 labels for 2 stretches" in capsys.readouterr().err
    assert clock_segments.main([str(path), "--limit-w", "700", "--labels", "drain", "0.5"]) == 0
    assert "drain" in capsys.readouterr().out
