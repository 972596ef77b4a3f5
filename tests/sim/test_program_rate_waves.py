"""experiments/kernels/program_rate.py --even-waves: the probe's even decode batches against the
fluid of sim.decode_programs, with and without the kernel's waves (no GPU: the committed probe)."""

from __future__ import annotations

import pytest

from experiments.kernels import program_rate

PROBE = "experiments/kernels/balance_h200/kernel.csv"


def test_the_waves_add_time_only_where_a_launch_overflows_the_gpus_slots():
    table = program_rate.even_waves(PROBE, per_sm=5, rate=12.9e9).set_index("batch")
    slots = 5 * program_rate.SMS
    assert (table.loc[table.programs <= slots, "waves_added_us"] == 0).all()
    # 768 programs: a last wave of 108 walking at the program rate, on the GPU and in the fluid
    assert table.loc[96, "waves_added_us"] > 15 and table.loc[96, "probe_over_all_start_us"] > 15
    # a slower program rate makes the waves' tail longer
    slower = program_rate.even_waves(PROBE, per_sm=5, rate=8e9).set_index("batch")
    assert slower.loc[96, "waves_added_us"] > table.loc[96, "waves_added_us"]


def test_main_prints_the_even_rows(capsys):
    program_rate.main([PROBE, "--even-waves", "12.9"])
    out = capsys.readouterr().out
    assert "waves_added_us" in out and "probe_over_all_start_us" in out
    with pytest.raises(SystemExit):
        program_rate.main([PROBE, "--even-waves", "fast"])
