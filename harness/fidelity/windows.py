"""Where a request's time between its first and last token goes, run by run: the steps that ran in
that window split into prefill (and mixed) steps, decode steps and the rest (device idle, host
time the overlap did not hide). With long prompts and few output tokens (the code_completion
class) a request's TPOT is mostly other requests' prefill steps run between its tokens, so a
TPOT error is either those steps priced wrong or a different number of them in the window: the
replays (harness.fidelity.steps) price the engine's own steps, these rows count them, for the
engine's runs and the simulated ones side by side.

A step table row may stand for several steps (`num_steps`, default 1: a simulator's
fast-forwarded run of decode steps); it counts that many, its time once. Such a run never spans a
request's first or last token (an event ends it), so windows split whole rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

_EPS = 1e-9  # a step that ends at a request's first token (its prefill) is before the window
NEAR_MEDIAN = (0.4, 0.6)  # requests whose TPOT is in these quantiles explain TPOT P50


def window_parts(requests: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per request with two output tokens or more: tpot, and over its window (first token to
    finish) the seconds and number of prefill steps and of decode steps, and the rest."""
    order = steps.sort_values("start", kind="stable")
    ends = (order["start"] + order["duration"]).to_numpy(dtype=float)
    duration = order["duration"].to_numpy(dtype=float)
    counts = order["num_steps"].fillna(1).to_numpy(dtype=float) if "num_steps" in order else np.ones(len(order))
    is_decode = (order["kind"] == "decode").to_numpy()
    cumulative = {name: np.concatenate(([0.0], np.cumsum(values))) for name, values in {
        "prefill_s": np.where(is_decode, 0.0, duration), "decode_s": np.where(is_decode, duration, 0.0),
        "prefill_steps": np.where(is_decode, 0.0, counts), "decode_steps": np.where(is_decode, counts, 0.0)}.items()}
    served = requests[requests["output_tokens"] > 1]
    first = np.searchsorted(ends, served["first_token"].to_numpy(dtype=float) + _EPS, side="right")
    last = np.searchsorted(ends, served["finish"].to_numpy(dtype=float) + _EPS, side="right")
    parts = pd.DataFrame({"tpot": served["tpot"].to_numpy(dtype=float),
                          "window_s": (served["finish"] - served["first_token"]).to_numpy(dtype=float),
                          "tokens": served["output_tokens"].to_numpy(dtype=float) - 1})
    for name, sums in cumulative.items():
        parts[name] = sums[last] - sums[first]
    parts["other_s"] = parts["window_s"] - parts["prefill_s"] - parts["decode_s"]
    return parts


def window_row(label: str, requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float | str]:
    """One run's summary: TPOT P50 and, over the requests near it (NEAR_MEDIAN), the mean TPOT split
    into prefill, decode and other seconds per output token and the mean number of prefill and
    decode steps in a window; the same split over all requests; and the run's steps by kind."""
    parts = window_parts(requests, steps)
    row: dict[str, float | str] = {"run": label, "requests": float(len(parts)),
                                   "tpot_p50_s": float(parts["tpot"].median()) if len(parts) else np.nan}
    lo, hi = parts["tpot"].quantile(list(NEAR_MEDIAN)) if len(parts) else (np.nan, np.nan)
    for scope, part in (("p50", parts[(parts["tpot"] >= lo) & (parts["tpot"] <= hi)]), ("all", parts)):
        for name in ("prefill_s", "decode_s", "other_s"):
            row[f"{scope}_tpot_{name}"] = float((part[name] / part["tokens"]).mean()) if len(part) else np.nan
        for name in ("prefill_steps", "decode_steps"):
            row[f"{scope}_{name}"] = float(part[name].mean()) if len(part) else np.nan
    counts = steps["num_steps"].fillna(1) if "num_steps" in steps else pd.Series(1.0, index=steps.index)
    for kind, mask in (("prefill", steps["kind"] != "decode"), ("decode", steps["kind"] == "decode")):
        n = float(counts[mask].sum())
        row[f"{kind}_steps"] = n
        row[f"{kind}_step_mean_s"] = float(steps.loc[mask, "duration"].sum() / n) if n else np.nan
    prefills = float(counts[steps["kind"] != "decode"].sum())
    row["prefill_tokens_per_step"] = float(steps["prefill_tokens"].sum() / prefills) if prefills else np.nan
    return row


def window_table(runs: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    """window_row of each run: label -> (requests, steps)."""
    return pd.DataFrame([window_row(label, requests, steps) for label, (requests, steps) in runs.items()])
