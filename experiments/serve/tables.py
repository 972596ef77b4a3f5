"""The serving benchmark's tables: latency rows per source, the servers' overhead, the markdown.

Sources per case (workload, load): `harness_run` (python -m harness, no HTTP), `<server>_client`
(what the in-repo client measured) or `<server>_aiperf` (what aiperf measured, --loadgen aiperf),
`<server>_own` (the server's requests.csv for the same requests). TTFT and inter-token latency (ITL:
per request (last - first token) / (tokens - 1), the harness's tpot) are percentiles over requests.
step_period_p50_ms is the median wall time between consecutive step ends while the case ran: the
engine's steps behind a server should take what they take in the harness's loop (step_split also
gives the device's time per step and the host time it waited for). host_scale: the speed of the
host that launched the engine's steps against the profile's (experiments/serve/host.py), and the
one the simulator's server was priced at.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LATENCY = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms")
LOADGENS = ("client", "aiperf")  # who replays the requests against a server: the in-repo client, or aiperf


def latency_row(source: str, ttft_s, itl_s) -> dict:
    ttft = np.asarray(ttft_s, dtype=float) * 1e3
    itl = np.asarray(itl_s, dtype=float) * 1e3
    ttft, itl = ttft[~np.isnan(ttft)], itl[~np.isnan(itl)]
    row: dict = {"source": source, "requests": len(ttft)}
    for name, values in (("ttft", ttft), ("itl", itl)):
        for q in (50, 90):
            row[f"{name}_p{q}_ms"] = float(np.percentile(values, q)) if len(values) else np.nan
        row[f"{name}_mean_ms"] = float(values.mean()) if len(values) else np.nan
    return row


def step_split(steps: pd.DataFrame, start: float = -np.inf, end: float = np.inf) -> dict:
    """Among the steps that began in [start, end], medians in ms: the wall time between consecutive
    step ends (step_period), the device's time per step (duration) and, where the engine's step
    recorder ran, the host time the device waited for (host_s: the loop's time not hidden behind
    the device, harness.output.recording)."""
    inside = steps[(steps["start"] >= start) & (steps["start"] <= end)]
    ends = np.sort((inside["start"] + inside["duration"]).to_numpy(float))
    row = {"step_period_p50_ms": float(np.median(np.diff(ends)) * 1e3) if len(ends) > 1 else np.nan,
           "step_device_p50_ms": float(inside["duration"].median() * 1e3) if len(inside) else np.nan}
    if "host_s" in inside.columns:
        row["step_host_p50_ms"] = float(inside["host_s"].median() * 1e3)
    return row


def harness_row(requests: pd.DataFrame, steps: pd.DataFrame) -> dict:
    served = requests[requests["finish_reason"] != "aborted"]
    return {**latency_row("harness_run", served["ttft"], served["tpot"]), **step_split(steps)}


def server_rows(server: str, client: pd.DataFrame, own: pd.DataFrame, steps: pd.DataFrame, loadgen: str = "client",
                client_figures: dict | None = None) -> tuple[list[dict], dict]:
    """The load generator's and the server's own rows for one case, and the server's overhead on it.
    client: per request ttft_s, itl_s, late_s (the in-repo client's ClientRecords, or aiperf's);
    own: the server's requests.csv rows of the case; steps: its whole steps table. client_figures:
    the load generator's own percentiles, which replace those computed from client (aiperf's)."""
    client_row = {**latency_row(f"{server}_{loadgen}", client["ttft_s"], client["itl_s"]), **(client_figures or {}),
                  "late_max_ms": float(client["late_s"].max() * 1e3)}
    own_row = {**latency_row(f"{server}_own", own["ttft"], own["tpot"]),
               **step_split(steps, own["arrival"].min(), own["finish"].max())}
    return [client_row, own_row], overhead_row(server, client, own)


def case_requests(requests: pd.DataFrame, sizes: list[int], clients: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """Each case's rows of the server's requests.csv (sizes: its request count; clients: its load
    generator's records): by the server's request ids where the client kept them, else by arrival
    (the cases ran one after the other, each to its end)."""
    if all("request_id" in client for client in clients):
        return [requests[requests["request_id"].isin(client["request_id"])] for client in clients]
    ordered = requests.sort_values("arrival", kind="stable")
    ends = np.cumsum(sizes)
    if ends[-1] != len(ordered):
        raise RuntimeError(f"the server recorded {len(ordered)} requests, the cases sent {ends[-1]}")
    return [ordered.iloc[end - size:end] for size, end in zip(sizes, ends, strict=True)]


def overhead_row(server: str, client: pd.DataFrame, own: pd.DataFrame) -> dict:
    """Per request: the HTTP side's part of TTFT (parse, validate, hand-off; the first token's way to
    the socket); per token: the send lag, weighted by each request's tokens; the residual: client
    TTFT less the server's http_ttft (connection, the kernel, uvicorn before the app, the client)."""
    tokens = own["output_tokens"].to_numpy(float)
    lag = own["send_lag_mean"].to_numpy(float)
    row = {"server": server, "requests": len(own)}
    for name in ("overhead_s", "http_in", "first_token_out"):
        values = own[name].dropna().to_numpy(float) * 1e3
        row[f"{name.removesuffix('_s')}_p50_ms"] = float(np.percentile(values, 50)) if len(values) else np.nan
        row[f"{name.removesuffix('_s')}_mean_ms"] = float(values.mean()) if len(values) else np.nan
    ok = ~np.isnan(lag)
    row["per_token_ms"] = float((lag[ok] * tokens[ok]).sum() / tokens[ok].sum() * 1e3) if ok.any() else np.nan
    row["per_token_p90_ms"] = float(np.percentile(lag[ok], 90) * 1e3) if ok.any() else np.nan
    # the same requests on both sides, so the mean of the differences is the difference of the means
    row["client_residual_mean_ms"] = float((client["ttft_s"].mean() - own["http_ttft"].mean()) * 1e3)
    return row


def _fmt(value) -> str:
    if isinstance(value, float):
        return "" if np.isnan(value) else f"{value:.2f}"
    return str(value)


def _table(frame: pd.DataFrame, cols: list[str]) -> list[str]:
    cols = [c for c in cols if c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return lines + ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in frame[cols].itertuples(index=False)]


def sim_vs_engine(frame: pd.DataFrame) -> pd.DataFrame:
    """The simulator server's client-side figures against the engine server's, in percent."""
    rows: list[dict] = []
    if frame.empty:  # every stage failed
        return pd.DataFrame(rows)
    for (name, load), group in frame.groupby(["workload", "load"], sort=False):
        by = group.set_index("source")
        loadgen = next((g for g in LOADGENS if {f"engine_server_{g}", f"sim_server_{g}"} <= set(by.index)), None)
        if loadgen is None:
            continue
        row = {"workload": name, "load": load}
        for col in LATENCY:
            engine = by.loc[f"engine_server_{loadgen}", col]
            row[f"{col.removesuffix('_ms')}_diff_pct"] = (by.loc[f"sim_server_{loadgen}", col] - engine) / engine * 100
        row["within_10pct"] = all(abs(row[f"{c.removesuffix('_ms')}_diff_pct"]) <= 10 for c in LATENCY)
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame, overhead: pd.DataFrame) -> str:
    lines = _table(frame, ["workload", "load", "rate_rps", "source", "requests", *LATENCY, "step_period_p50_ms",
                           "step_device_p50_ms", "step_host_p50_ms", "host_scale", "late_max_ms"])
    if len(overhead):
        lines += ["", "Server overhead (ms): per request, the HTTP side's part of TTFT (`overhead`, of which "
                  "`http_in` before the core has the request); per token, the send lag (token ready to its "
                  "event on the socket); `client_residual`: client TTFT less the server's HTTP-side TTFT.", ""]
        lines += _table(overhead, ["workload", "load", "server", "requests", "overhead_p50_ms", "overhead_mean_ms",
                                   "http_in_mean_ms", "first_token_out_mean_ms", "per_token_ms", "per_token_p90_ms",
                                   "client_residual_mean_ms"])
    versus = sim_vs_engine(frame)
    if len(versus):
        lines += ["", "Simulator server against engine server, client-side (percent; target: within 10%):", ""]
        lines += _table(versus, list(versus.columns))
    return "\n".join(lines) + "\n"
