"""What the HTTP side adds to each request and each token: requests.csv's http_* columns and the
one-row serve_overhead.csv.

A request's way through the server (docs/serving.md#overhead): it reaches the ASGI app
(http_arrival), is parsed, validated, tokenised and handed to the core (arrival, the run's own
clock starts here), waits and is computed (first_token, the run's TTFT), and its first token's
event is handed to the socket (first_sent). So per request

    http_ttft = first_sent - http_arrival = http_in + ttft + first_token_out

and the HTTP side's share is http_in + first_token_out (overhead_s). Per token, the send lag is
the time from the token's step end (the engine) or its scheduled time (the simulator) to its
event being handed to the socket: hand-off between the processes, detokenisation, SSE encoding,
the write; the simulator's is negative for a token written before its time (serve.max_early_ms,
which also makes first_token_out negative by as much). Times are on the run's clock (simulated
seconds for the simulator: wall seconds times serve.time_scale), as the other columns of
requests.csv.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from harness.serve.generation import HttpTimes

HTTP_COLUMNS = ("http_arrival", "http_in", "first_sent", "first_token_out", "http_ttft", "overhead_s",
                "send_lag_mean")


def with_http_times(requests: pd.DataFrame, times: dict[str, HttpTimes], origin: float,
                    scale: float) -> pd.DataFrame:
    """requests with the HTTP_COLUMNS (NaN where a request never reached that point)."""
    rows = [times.get(rid) for rid in requests["request_id"]]

    def clock(values: list[float | None]) -> np.ndarray:
        return (np.array([np.nan if v is None else v for v in values], dtype=float) - origin) * scale

    out = requests.copy()
    out["http_arrival"] = clock([t.http_arrival if t else None for t in rows])
    out["http_in"] = out["arrival"] - out["http_arrival"]
    out["first_sent"] = clock([t.first_sent if t else None for t in rows])
    out["first_token_out"] = out["first_sent"] - out["first_token"]
    out["http_ttft"] = out["first_sent"] - out["http_arrival"]
    out["overhead_s"] = out["http_in"] + out["first_token_out"]
    out["send_lag_mean"] = np.array([t.send_lag_sum / t.send_lag_tokens * scale if t and t.send_lag_tokens
                                     else np.nan for t in rows], dtype=float)
    return out


def overhead_summary(requests: pd.DataFrame, lags: Iterable[float], send_lags: Iterable[float],
                     handoff_s: list[float], scale: float, http_cpu_s: float = float("nan"),
                     api_servers: int = 1, tokens_sent: int | None = None) -> pd.DataFrame:
    """One row: the per-request overhead and its parts; per token, the lag to the HTTP side's loop
    (dispatch) and to the socket (send), in ms, over the latest tokens each HTTP process kept
    (passes.LAG_SAMPLES), and the HTTP processes' CPU (http_cpu_s, while they listened) over every
    token streamed (tokens_sent; None: as many as the lags), in us; per step, the core process's
    hand-off, in us."""
    served = requests[requests["finish_reason"] != "aborted"]
    send_lags = list(send_lags)
    tokens = len(send_lags) if tokens_sent is None else tokens_sent
    row: dict[str, float | int] = {"requests": len(served), "tokens": tokens, "api_servers": api_servers,
                                   "http_cpu_us_per_token": http_cpu_s / tokens * 1e6 if tokens else float("nan")}
    for column in ("http_in", "first_token_out", "overhead_s", "http_ttft", "ttft"):
        values = served[column].dropna().to_numpy(float) * 1e3
        name = column.removesuffix("_s")
        for q in (50, 90):
            row[f"{name}_p{q}_ms"] = float(np.percentile(values, q)) if len(values) else np.nan
        row[f"{name}_mean_ms"] = float(values.mean()) if len(values) else np.nan
    for name, samples in (("dispatch_lag", lags), ("send_lag", send_lags)):
        values = np.asarray(samples, dtype=float) * scale * 1e3
        for q in (1, 50, 90, 99):  # P1: how early (serve.max_early_ms), the others how late
            row[f"{name}_p{q}_ms"] = float(np.percentile(values, q)) if len(values) else np.nan
        row[f"{name}_mean_ms"] = float(values.mean()) if len(values) else np.nan
        row[f"{name}_min_ms"] = float(values.min()) if len(values) else np.nan
        row[f"{name}_max_ms"] = float(values.max()) if len(values) else np.nan
    handoff = np.asarray(handoff_s, dtype=float) * 1e6
    for q in (50, 99):
        row[f"handoff_p{q}_us"] = float(np.percentile(handoff, q)) if len(handoff) else np.nan
    return pd.DataFrame([row])
