"""experiments/kernels/program_rate.py --waves: the probe's one-split decode batches against the
fluid of sim.decode_programs, with and without the kernel's waves (no GPU: the committed probes)."""

from __future__ import annotations

import pytest

from experiments.kernels import program_rate

PROBE = "experiments/kernels/balance_h200/kernel.csv"
PAST_ONE_WAVE = "experiments/kernels/balance_h200_waves/kernel.csv.gz"


def test_the_waves_add_time_only_where_a_launch_overflows_the_gpus_slots():
    table = program_rate.against_fluid(PROBE, per_sm=5, rate=12.9e9).set_index(["batch", "contexts"])
    slots = 5 * program_rate.SMS
    assert (table.loc[table.programs <= slots, "waves_added_us"] == 0).all()
    # 768 even programs: a last wave of 108 walking at the program rate, on the GPU and in the fluid
    assert table.loc[(96, "even"), "waves_added_us"] > 15 and table.loc[(96, "even"), "probe_over_all_start_us"] > 15
    # a slower program rate makes the waves' tail longer
    slower = program_rate.against_fluid(PROBE, per_sm=5, rate=8e9).set_index(["batch", "contexts"])
    assert slower.loc[(96, "even"), "waves_added_us"] > table.loc[(96, "even"), "waves_added_us"]


def test_the_contexts_are_drawn_again_as_the_probe_drew_them():
    # a row is compared only where the redrawn contexts add up to the probe's total_context
    table = program_rate.against_fluid(PAST_ONE_WAVE, 5, 12.9e9, fit_path=PROBE)
    assert set(table.contexts) == {"even", "ragged", "tail"}
    assert sorted(table.batch.unique()) == [72, 80, 84, 88, 96, 104, 112, 120, 128, 160]


def test_main_prints_the_rows_and_refuses_a_rate_that_is_no_number(capsys):
    program_rate.main([PROBE, "--waves", "12.9"])
    out = capsys.readouterr().out
    assert "waves_added_us" in out and "probe_over_all_start_us" in out
    with pytest.raises(SystemExit):
        program_rate.main([PROBE, "--waves", "fast"])
