"""The simulator server's client-side miss against the engine server's, in five parts that add up to
it exactly (ttft_split's last table; docs/serving.md).

For a figure F (TTFT or inter-token latency, P50 or P90; a core's inter-token figure is its TPOT),
with F(x) the quantile of x's requests:

    F(sim client) - F(engine client) =
        [F(sim client) - F(sim core)] - [F(engine client) - F(engine core)]   outside_core
      + F(sim core) - F(simulator at the sim server's arrivals)               sim_off_schedule
      + F(simulator at the sim server's arrivals) - F(at the harness's)       arrivals
      + F(simulator at the harness run's arrivals) - F(harness run)           step_model
      + F(harness run) - F(engine core)                                       server_steps

outside_core: the HTTP side (http_in, first_token_out) and what lies outside both servers (the
connection, the client: client_residual); sim_off_schedule: the simulator server's core against
its own schedule (0 when on schedule); arrivals: the same model at two sets of arrival times of
the same requests (and the two hosts it is priced at: the engine server's measured one, the
harness's); step_model: the step model with no server at all; server_steps: minus what the
server costs the engine's steps (its core against the harness's loop on the same requests). Each
part is a difference of quantiles, so the parts add up to the miss; each is given in percent of
the engine server's client figure, and the miss in ms too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

FIGURES = (("ttft_p50", "ttft", 50.0), ("ttft_p90", "ttft", 90.0), ("itl_p50", "itl", 50.0), ("itl_p90", "itl", 90.0))
PARTS = ("outside_core", "sim_off_schedule", "arrivals", "step_model", "server_steps")
CLIENT = {"ttft": "ttft_s", "itl": "itl_s"}  # the load generator's column of each figure
CORE = {"ttft": "ttft", "itl": "tpot"}  # a core's (requests.csv) column of each figure


def quantile_ms(values: pd.Series | np.ndarray, q: float) -> float:
    """The q-th percentile of values (seconds) in ms, NaNs left out; NaN where none is left."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    return float(np.percentile(array, q) * 1e3) if array.size else float("nan")


def miss_parts(engine: pd.DataFrame, sim: pd.DataFrame, harness: pd.DataFrame, at_harness: pd.DataFrame,
               at_sim: pd.DataFrame) -> pd.DataFrame:
    """One row per figure: the engine and simulator servers' client figures (ms), the miss (ms and %)
    and its PARTS (% of the engine server's figure). engine, sim: each server's requests.csv rows
    with the client's ttft_s and itl_s beside them; harness: the harness's own run of the case;
    at_harness, at_sim: the simulator's run at the harness run's and the sim server's arrivals."""
    rows = []
    for figure, kind, q in FIGURES:
        client, core = CLIENT[kind], CORE[kind]
        values = {"engine_client": quantile_ms(engine[client], q), "engine_core": quantile_ms(engine[core], q),
                  "sim_client": quantile_ms(sim[client], q), "sim_core": quantile_ms(sim[core], q),
                  "at_sim": quantile_ms(at_sim[core], q), "at_harness": quantile_ms(at_harness[core], q),
                  "harness": quantile_ms(harness[core], q)}
        v = values
        parts = {"outside_core": (v["sim_client"] - v["sim_core"]) - (v["engine_client"] - v["engine_core"]),
                 "sim_off_schedule": v["sim_core"] - v["at_sim"], "arrivals": v["at_sim"] - v["at_harness"],
                 "step_model": v["at_harness"] - v["harness"], "server_steps": v["harness"] - v["engine_core"]}
        base = v["engine_client"]
        miss = v["sim_client"] - base
        rows.append({"figure": figure, "engine_ms": base, "sim_ms": v["sim_client"], "miss_ms": miss,
                     "miss_pct": miss / base * 100, **{f"{p}_pct": parts[p] / base * 100 for p in PARTS}})
    return pd.DataFrame(rows)
