"""experiments/serve/rebuild.py: a bench_serve folder cut short while the simulator server ran gets
that server's aiperf rows from its complete reports, and the comparison table from them."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from experiments.serve.rebuild import main, rebuild, tag_case

ENGINE = {"azure": {0.5: (10.0, 20.0, 4.0, 5.0), 0.8: (12.0, 24.0, 8.0, 10.0)}}


def report(ttft: tuple[float, float], itl: tuple[float, float], **extra) -> dict:
    return {"request_count": {"avg": 400.0}, "time_to_first_token": {"p50": ttft[0], "p90": ttft[1], "avg": ttft[0]},
            "inter_token_latency": {"p50": itl[0], "p90": itl[1], "avg": itl[0]}, "is_complete": True, **extra}


@pytest.fixture
def out(tmp_path):
    rows = [{"workload": "azure", "load": load, "rate_rps": 30.0 * load / 0.5, "source": "engine_server_aiperf",
             "requests": 400, "ttft_p50_ms": a, "ttft_p90_ms": b, "itl_p50_ms": c, "itl_p90_ms": d}
            for load, (a, b, c, d) in ENGINE["azure"].items()]
    pd.DataFrame(rows).to_csv(tmp_path / "serve.csv", index=False)
    for tag, body in (("azure_50", report((10.5, 19.0), (4.2, 5.6))),  # within 10%, but ITL P90 +12%
                      ("azure_80", report((12.0, 24.0), (8.0, 10.0), was_cancelled=True))):
        (tmp_path / "sim_server" / f"aiperf_{tag}").mkdir(parents=True)
        (tmp_path / "sim_server" / f"aiperf_{tag}" / "profile_export_aiperf.json").write_text(json.dumps(body))
    (tmp_path / "sim_server" / "aiperf_mooncake_50").mkdir()  # cut short: no report
    return tmp_path


def test_complete_reports_add_rows_and_the_comparison(out, tmp_path):
    frame = rebuild(out, tmp_path / "to")
    sim = frame[frame["source"] == "sim_server_aiperf"]
    assert list(zip(sim["workload"], sim["load"], sim["rate_rps"])) == [("azure", 0.5, 30.0)]  # not the cancelled
    assert sim[["ttft_p50_ms", "itl_p90_ms"]].iloc[0].tolist() == [10.5, 5.6]
    text = (tmp_path / "to" / "serve.md").read_text()
    assert "| azure | 0.50 | 5.00 | -5.00 | 5.00 | 12.00 | False |" in text
    assert (out / "serve.csv").read_text().count("\n") == 3  # the given folder left as it was
    rebuilt_again = rebuild(tmp_path / "to", tmp_path / "to")  # rows already there are not added twice
    assert len(rebuilt_again) == len(frame)


def test_a_tag_that_is_no_case_is_named(out, capsys):
    assert tag_case("mooncake_80") == ("mooncake", 80)
    (out / "sim_server" / "aiperf_azure_95").mkdir()
    (out / "sim_server" / "aiperf_azure_95" / "profile_export_aiperf.json").write_text(json.dumps(
        report((1.0, 2.0), (1.0, 2.0))))
    with pytest.raises(SystemExit):
        main([str(out)])
    assert "aiperf_azure_95/profile_export_aiperf.json: no case azure at 95% in serve.csv" in capsys.readouterr().err
