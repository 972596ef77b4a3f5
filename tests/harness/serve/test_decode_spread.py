"""experiments/serve/decode_spread.py: the running set's contexts at a step, and on a pack the
simulator made itself, prices that find the simulator's own step durations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.serve import decode_spread, step_prices
from tests.harness.serve.test_step_prices import simulated_mooncake_pack

pytestmark = pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return simulated_mooncake_pack(tmp_path_factory.mktemp("spread"))


def test_the_running_set_is_the_requests_decoding_at_their_own_pace():
    requests = pd.DataFrame({"first_token": [0.0, 1.0, 5.0], "finish": [10.0, 2.0, 6.0],
                             "prompt_tokens": [100, 50, 7], "output_tokens": [11, 3, 2]})
    # at 4 s: the first request has decoded 4 of its 10 tokens after the first; the others are not decoding
    assert decode_spread.running_contexts(requests, 4.0).tolist() == [100 + 1 + 4]
    assert decode_spread.running_contexts(requests, 1.5).tolist() == [100 + 1 + 1, 50 + 1 + 1]
    assert decode_spread.running_contexts(requests, 10.0).size == 0


def test_the_simulators_own_steps_are_found_at_their_price(pack, capsys):
    requests = pd.read_csv(pack / "mooncake_50" / "requests.csv")
    steps = pd.read_csv(pack / "mooncake_50" / "steps.csv.gz")
    overrides = step_prices.case_overrides(pack, "mooncake_50")
    table = decode_spread.priced(requests, steps, overrides)
    assert len(table) > 10 and np.all(table.cv >= 0)
    # the reconstructed running set is the step's batch, and the price the simulator charged
    counts = [decode_spread.running_contexts(requests, t).size for t in table.start]
    assert np.mean(np.array(counts) == table.num_seqs.to_numpy()) > 0.9
    assert abs(np.median(table.priced / table.measured) - 1) < 0.01
    assert decode_spread.main([str(pack), "--case", "mooncake_50", "--min-seqs", "1"]) == 0
    out = capsys.readouterr().out
    assert "harness_run" in out and "by context CV" in out and "engine_server" not in out
    with pytest.raises(SystemExit):
        decode_spread.main([str(pack), "--case", "mooncake_50", "--set", "workload.seed=1"])
    assert "--set: ['workload.seed=1']" in capsys.readouterr().err


def test_the_batch_table_takes_the_bins_given_and_refuses_bad_ones(pack, capsys):
    assert decode_spread.main([str(pack), "--case", "mooncake_50", "--batch-bins", "0", "2", "1000"]) == 0
    out = capsys.readouterr().out
    assert "(0, 2]" in out and "(2, 1000]" in out and "(16, 32]" not in out
    with pytest.raises(SystemExit):
        decode_spread.main([str(pack), "--case", "mooncake_50", "--batch-bins", "8", "4"])
    assert "--batch-bins: give at least two ascending edges" in capsys.readouterr().err
