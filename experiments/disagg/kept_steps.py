"""`run_disagg.py measure --keep-steps`: every measured run's per-replica steps, and its simulation's
beside them, one gzipped CSV per cell: steps_<fleet>_<workload>_<load>.csv.gz.

One row per step of one replica, the columns that say what the step was and when it ran (no
per-request data, so a cell is some 10^4 rows and a few hundred kB at most):

  side         "measured", or the simulated side's cost model ("profiled", "roofline")
  pool         "prefill" / "decode" (a disaggregated fleet), "aggregated" (the aggregated one)
  replica      the replica's index within its pool
  step, start, duration   the replica's step number, its start and its length in seconds (an
               overlapped engine step starts at its end less its duration: the device's view)
  kind         prefill, decode or mixed
  requests     the batch: requests scheduled in the step
  prefill_tokens, decode_tokens   new tokens
  running, waiting, preempted     the replica's queue after planning
  kv_tokens    KV cache in use after planning, in tokens (used blocks x block size): the context the
               step's requests hold, within a block per request

and, where the measured side's replicas kept them (engine.core.launch_log; files written before
have none, and read_kept reads them all the same), what sim.host_speed reads the serving host's
speed off (experiments/disagg/fleet_hosts.py):

  launch_s     the host time of the step's submit(); empty where the step did not overlap and on
               the simulated side
  graph_batch_size, decode_context_tokens, decode_repeated_tokens   a decode graph step's launch
               fit features (0 for any other step, and on the simulated side)

experiments/disagg/step_report.py reads them back (read_kept) and compares the sides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

SIDE_KEYS = ("side", "pool", "replica")
# what the fleets' step tables must hold for a kept file (harness.output.metrics names)
STEP_COLUMNS = ("step", "start", "duration", "kind", "requests", "prefill_tokens", "decode_tokens", "running",
                "waiting", "preempted", "free_blocks")
KEPT_COLUMNS = (*SIDE_KEYS, "step", "start", "duration", "kind", "requests", "prefill_tokens", "decode_tokens",
                "running", "waiting", "preempted", "kv_tokens")
# kept where the measured side has them (module docstring); the features are 0 where a step has none
LAUNCH_KEPT = ("launch_s", "graph_batch_size", "decode_context_tokens", "decode_repeated_tokens")
AGGREGATED_POOL = "aggregated"


def kept_name(cell: dict[str, Any]) -> str:
    return f"steps_{cell['fleet']}_{cell['workload']}_{cell['load']}.csv.gz"


def replica_blocks(outcome: Any) -> dict[tuple[str, int], int]:
    """(pool, replica) -> the replica's KV blocks, of a disaggregated or an aggregated fleet's outcome."""
    pools = getattr(outcome, "pool_blocks", None)
    if pools is None:
        return {(AGGREGATED_POOL, i): b for i, b in enumerate(outcome.replica_blocks)}
    return {(pool, i): b for pool, blocks in pools.items() for i, b in enumerate(blocks)}


def side_steps(side: str, outcome: Any, block_size: int) -> pd.DataFrame:
    """One side's steps in the kept layout (KEPT_COLUMNS, and LAUNCH_KEPT where it has them)."""
    steps = outcome.steps
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise ValueError(f"kept steps: the run's step table lacks {missing} (serve it with kept_steps.STEP_COLUMNS)")
    pool = steps["pool"] if "pool" in steps.columns else pd.Series(AGGREGATED_POOL, index=steps.index)
    blocks = replica_blocks(outcome)
    total = pd.Series([blocks[(p, r)] for p, r in zip(pool, steps["replica"])], index=steps.index)
    table = steps.assign(side=side, pool=pool, kv_tokens=(total - steps["free_blocks"]) * block_size)
    return table[[*KEPT_COLUMNS, *(c for c in LAUNCH_KEPT if c in table.columns)]]


def write_kept(out: Path, cell: dict[str, Any], sides: dict[str, Any], block_size: int) -> Path:
    """sides: side name -> the run's outcome (FleetOutcome or DisaggOutcome); one file for the cell."""
    table = pd.concat([side_steps(side, outcome, block_size) for side, outcome in sides.items()], ignore_index=True)
    if "launch_s" in table.columns:  # a side without them (the simulated one) has no launch, no features
        features = [c for c in LAUNCH_KEPT[1:] if c in table.columns]
        table[features] = table[features].fillna(0).astype("int64")
    path = out / kept_name(cell)
    # microseconds are the engine clock's resolution that matters here; the gzip level trades a
    # little CPU for a bundle that a device call returns
    table.to_csv(path, index=False, float_format="%.6f", compression={"method": "gzip", "compresslevel": 9})
    return path


def read_kept(path: Path) -> pd.DataFrame:
    """A kept file, with the cell's fleet, workload and load (from its name) as columns."""
    try:
        table = pd.read_csv(path)
    except (OSError, EOFError, UnicodeDecodeError, pd.errors.ParserError) as error:
        raise ValueError(f"{path}: not a kept steps file ({error})") from None
    missing = [c for c in KEPT_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: not a kept steps file (no {missing}); run_disagg measure --keep-steps writes them")
    name = path.name.removeprefix("steps_").removesuffix(".csv.gz")
    fleet, workload, load = name.split("_", 2)
    return table.assign(fleet=fleet, workload=workload, load=load)
