"""The held-out protocol's schedule identity (harness.fidelity.study): schedules.csv.

Offline, a simulated run makes the engine's decisions step by step (the same core, and no arrival
that the two clocks could order differently), so a class whose offline schedule is not the
engine's points at a decision that depends on the backend rather than at a cost model. Only the
offline cell of each class is compared: under arrivals the clocks decide what is admitted when,
so schedules part by design.

One row per class, engine repeat and run compared (harness.compare.tables.schedule_table on the
recorded schedule_hash of each step):
- cost_model <name> ("profiled", "roofline", "carried"): repeat `engine_repeat` of the engine
  against that cost model's simulation (the profiled model's point-estimate run, not the
  perturbed runs of its interval);
- cost_model "engine_repeat": repeat `engine_repeat` (>= 1) against repeat 0, the engine against
  itself. Here the engine_* columns are repeat 0's and the sim_* columns repeat `engine_repeat`'s.
  It separates the engine's own nondeterminism from the simulator's: a cost model that matches
  one repeat but not another only means the engine parted from itself.
first_divergent_step is -1 for identical schedules, else the first 0-based step that differs
(the shorter run's length where one is a prefix of the other).
"""

from __future__ import annotations

import pandas as pd

from harness.compare.tables import schedule_table
from harness.convert import ConfigError

COLUMNS = ("model", "hardware", "workload", "cost_model", "engine_repeat", "schedule_identical",
           "first_divergent_step", "engine_steps", "sim_steps", "identical_steps", "engine_preemptions",
           "sim_preemptions")
ENGINE_REPEAT = "engine_repeat"
KEY = ["model", "hardware", "workload", "cost_model", "engine_repeat"]


def schedule_rows(rc, workload: str, engine_steps: list[pd.DataFrame],
                  sim_steps: dict[str, pd.DataFrame]) -> list[dict]:
    """Rows of schedules.csv for one class's offline cell: each engine repeat against each
    simulated run, then each later repeat against repeat 0."""
    rows = []
    for repeat, steps in enumerate(engine_steps):
        tables = [schedule_table(steps, sim_steps)] if sim_steps else []
        if repeat > 0:
            tables.append(schedule_table(engine_steps[0], {ENGINE_REPEAT: steps}))
        for table in tables:
            for _, compared in table.iterrows():
                rows.append({"model": rc.model.name, "hardware": rc.hardware.name, "workload": workload,
                             "cost_model": compared["run"], "engine_repeat": repeat,
                             **{c: _plain(compared[c]) for c in COLUMNS[5:]}})
    return rows


def _plain(value):
    """numpy scalars as Python ones, so the rows compare and print like the CSV reads back."""
    return value.item() if hasattr(value, "item") else value


def schedules_frame(rows: list[dict]) -> pd.DataFrame:
    """The rows in COLUMNS order (an empty table keeps its header)."""
    return pd.DataFrame(rows, columns=list(COLUMNS))


def merge_schedules(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """schedules.csv of several device calls as one; a later call's row replaces an earlier one's
    for the same model, hardware, class, cost model and engine repeat (as harness.fidelity.report.merge)."""
    for table in tables:
        missing = [c for c in COLUMNS if c not in table.columns]
        if missing:
            raise ConfigError(f"schedules.csv: missing column(s) {missing}; expected {list(COLUMNS)}")
    merged = pd.concat(tables, ignore_index=True)
    return merged.drop_duplicates(KEY, keep="last")[list(COLUMNS)].reset_index(drop=True)
