"""experiments/serve/arrival_noise.py: arrivals moved by a seeded normal draw (none before the
first), the simulator's own run given back when they barely move, and one-line refusals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.serve import arrival_noise
from experiments.serve.step_prices import SIM
from harness.run import run_once
from harness.scripting import compose_run_config
from tests.harness.serve.test_step_prices import mooncake_bench_folder


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    folder = tmp_path_factory.mktemp("noise")
    overrides = mooncake_bench_folder(folder)
    (folder / "harness" / "mooncake_50").mkdir()
    run_once(compose_run_config([*SIM, *overrides]), progress=False).requests.to_csv(
        folder / "harness" / "mooncake_50" / "requests.csv", index=False)
    return folder


def test_a_move_is_seeded_and_never_before_the_first_arrival():
    own = pd.DataFrame({"arrival": np.linspace(10.0, 11.0, 50)})
    a, b = arrival_noise.moved(own, 0.05, 3), arrival_noise.moved(own, 0.05, 3)
    assert a.equals(b) and not a.equals(arrival_noise.moved(own, 0.05, 4))
    assert a["arrival"].min() >= 10.0 and not np.allclose(a["arrival"], own["arrival"])


def test_the_unmoved_arrivals_give_the_run_back_and_the_draws_repeat(out):
    overrides = arrival_noise.case_overrides(out / "harness", "mooncake_50")
    own = pd.read_csv(out / "harness" / "mooncake_50" / "requests.csv")
    table = arrival_noise.case_noise(overrides, own, 1.0, 1e-3, 2)
    by_figure = table.set_index("figure")
    assert by_figure.loc["ttft_p50", "unmoved_ms"] == pytest.approx(own["ttft"].median() * 1e3, rel=1e-6)
    assert by_figure.loc["tpot_p90", "unmoved_ms"] == pytest.approx(np.percentile(own["tpot"], 90) * 1e3, rel=1e-6)
    assert table.equals(arrival_noise.case_noise(overrides, own, 1.0, 1e-3, 2))
    # the trace's bursts share a timestamp: a move of a millisecond reorders them, and TTFT follows
    assert (table[["min_pct", "max_pct"]].abs() > 0.1).any().any()


def test_main_prints_each_case_and_refuses_bad_arguments(out, capsys):
    assert arrival_noise.main([str(out), "--seeds", "2", "--sd-ms", "2"]) == 0
    assert "## mooncake_50" in capsys.readouterr().out
    for bad in (["--seeds", "1"], ["--sd-ms", "0"], ["--cases", "azure_80"]):
        with pytest.raises(SystemExit):
            arrival_noise.main([str(out), *bad])
    assert "--cases: ['azure_80'] not among" in capsys.readouterr().err
