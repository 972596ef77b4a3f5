"""The mid-run start, measured against simulated (experiments/autoscale/midrun_dp.py): TTFT P90 per
window of the two timelines, the moment the new replica takes traffic on each, and one plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.output.figures import save_figure

TTFT_TARGET = 0.15  # the timeline of TTFT P90 per window within 15% of the measured
READY_TARGET = 0.10  # the new replica's first traffic within 10% of its measured start-up time
MIN_REQUESTS = 20  # windows with fewer arrivals are shown, not scored


def compare_windows(engine: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """Per window of the engine's timeline.csv and the simulator's: arrivals, replicas serving and
    TTFT P90 of each, the simulator's relative error, and whether the window is scored."""
    rows = engine[["start_s", "end_s", "arrivals", "serving", "ttft_p90_s"]].merge(
        sim[["start_s", "arrivals", "serving", "ttft_p90_s"]], on="start_s", how="outer", suffixes=("", "_sim"))
    rows = rows.rename(columns={"ttft_p90_s": "ttft_p90_s_engine", "serving": "serving_engine",
                                "arrivals": "arrivals_engine"})
    rows["rel_error"] = (rows["ttft_p90_s_sim"] - rows["ttft_p90_s_engine"]) / rows["ttft_p90_s_engine"]
    rows["scored"] = rows["arrivals_engine"].fillna(0) >= MIN_REQUESTS
    rows["within_target"] = rows["scored"] & (rows["rel_error"].abs() <= TTFT_TARGET)
    return rows


def ready_times(engine: pd.DataFrame, sim: pd.DataFrame) -> dict:
    """The second replica (index 1 of lifetimes.csv) on both sides: when requested and ready, and the
    simulator's error in the ready moment as a fraction of the measured start-up. A replica that
    was not ready before the run ended (lifetimes.csv says ready at its stop) counts as never ready."""
    e, s = engine.iloc[1], sim.iloc[1]
    never = e["ready_s"] >= e["stop_s"] or s["ready_s"] >= s["stop_s"]
    startup = e["ready_s"] - e["requested_s"] if not never else np.nan
    error = s["ready_s"] - e["ready_s"] if not never else np.nan
    return {"requested_s_engine": e["requested_s"], "ready_s_engine": e["ready_s"], "startup_s_engine": startup,
            "requested_s_sim": s["requested_s"], "ready_s_sim": s["ready_s"],
            "startup_s_sim": s["ready_s"] - s["requested_s"], "ready_error_s": error,
            "ready_error_of_startup": error / startup if startup > 0 else np.nan, "ready_before_the_end": not never}


def summarize(windows: pd.DataFrame, ready: dict) -> dict:
    scored = windows[windows["scored"]]
    errors = scored["rel_error"].abs()
    return {"windows_scored": len(scored), "windows_within_15pct": int(scored["within_target"].sum()),
            "ttft_p90_median_abs_error": float(errors.median()) if len(errors) else np.nan,
            "ttft_p90_max_abs_error": float(errors.max()) if len(errors) else np.nan,
            "ttft_target_met": bool(len(scored)) and bool(scored["within_target"].all()), **ready,
            "ready_target_met": bool(abs(ready["ready_error_of_startup"]) <= READY_TARGET)}


def markdown(summary: dict, windows: pd.DataFrame, title: str) -> str:
    lines = [f"# {title}", "", "| quantity | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in summary.items()]
    lines += ["", "| window (s) | arrivals | serving (engine / sim) | TTFT P90 engine (s) | sim (s) | error |",
              "|---|---|---|---|---|---|"]
    for _, w in windows.iterrows():
        lines.append(f"| {w['start_s']:g}-{w['end_s']:g} | {w['arrivals_engine']:.0f} | {w['serving_engine']:.2f} / "
                     f"{w['serving_sim']:.2f} | {w['ttft_p90_s_engine']:.4g} | {w['ttft_p90_s_sim']:.4g} | "
                     f"{100 * w['rel_error']:+.1f}%{'' if w['scored'] else ' (not scored)'} |")
    return "\n".join(lines) + "\n"


def plot(windows: pd.DataFrame, ready: dict, title: str, path: Path) -> None:
    """Arrival rate and replicas serving; TTFT P90 per window, measured and simulated, with the
    moment the second replica was requested and became ready on each side."""
    fig = Figure(figsize=(10, 7), layout="constrained")
    load, ttft = fig.subplots(2, 1, sharex=True)
    mid = (windows["start_s"] + windows["end_s"]) / 2
    width = float((windows["end_s"] - windows["start_s"]).iloc[0])
    load.bar(mid, windows["arrivals_engine"] / width, width=0.9 * width, color="lightgray", label="arrival rate")
    load.set_ylabel("arrival rate (req/s)")
    serving = load.twinx()
    serving.step(windows["start_s"], windows["serving_engine"], where="post", color="tab:blue", label="engine")
    serving.step(windows["start_s"], windows["serving_sim"], where="post", color="tab:orange", ls="--", label="sim")
    serving.set_ylabel("replicas serving (mean per window)")
    serving.legend(loc="upper left", fontsize=8)
    ttft.plot(mid, windows["ttft_p90_s_engine"], "o-", color="tab:blue", label="engine (measured)")
    ttft.plot(mid, windows["ttft_p90_s_sim"], "s--", color="tab:orange", label="simulated")
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT P90 per window (s)")
    ttft.set_xlabel("time since the run started (s)")
    for ax in (load, ttft):
        ax.axvline(ready["requested_s_engine"], color="gray", lw=0.8, ls=":")
        ax.axvline(ready["ready_s_engine"], color="tab:blue", lw=0.8)
        ax.axvline(ready["ready_s_sim"], color="tab:orange", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
    ttft.plot([], [], color="tab:blue", lw=0.8, label=f"replica 2 ready, engine ({ready['ready_s_engine']:.1f} s)")
    ttft.plot([], [], color="tab:orange", lw=0.8, ls="--", label=f"replica 2 ready, sim ({ready['ready_s_sim']:.1f} s)")
    ttft.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)
