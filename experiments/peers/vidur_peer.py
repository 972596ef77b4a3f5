"""Vidur, the discrete-event peer of experiments/peers/compare_peers.py: a trace replay of our
requests, run from its own virtual environment."""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from experiments.peers.common import Prediction, Scenario, run_tool

VIDUR_DATE = "2023-08-21"  # its trace reader keeps the rows of one date, this one by default


def vidur_trace(requests: Sequence, path: Path) -> Path:
    """The requests as Vidur's trace_replay input: arrival time (s), prompt and output token counts."""
    pd.DataFrame({"Date": VIDUR_DATE, "Time": [r.arrival_time for r in requests],
                  "PromptTokenCount": [len(r.prompt_token_ids) for r in requests],
                  "CompletionTokenCount": [r.sampling_params.max_tokens for r in requests]}).to_csv(path, index=False)
    return path


def parse_vidur(folder: Path, makespan_tokens: int) -> dict[str, float]:
    """Vidur's request_metrics.csv: TTFT (prefill_e2e_time), TPOT (decode time per output token), throughput."""
    metrics = pd.read_csv(next(Path(folder).rglob("request_metrics.csv")))
    ttft = metrics["prefill_e2e_time"]
    tpot = metrics["decode_time_execution_plus_preemption_normalized"]
    end = (metrics["arrived_at"] + metrics["request_e2e_time"]).max() if "arrived_at" in metrics else math.nan
    return {"output_tok_s": makespan_tokens / end, "ttft_p50_s": ttft.quantile(0.5), "ttft_p90_s": ttft.quantile(0.9),
            "tpot_p50_s": tpot.quantile(0.5), "tpot_p90_s": tpot.quantile(0.9)}


def vidur(venv: Path, scenario: Scenario, requests: Sequence) -> Prediction:
    """Vidur 0.0.26 on its closest model (Llama-3-8B: Qwen3-8B's width and heads, 32 layers not 36,
    MLP 14,336 not 12,288), vLLM scheduler capped at 512 sequences, trace replay of our requests."""
    tool = "Vidur 0.0.26 (Llama-3-8B)"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trace = vidur_trace(requests, Path(tmp) / "trace.csv")
        cmd = [str(venv / "bin" / "python"), "-m", "vidur.main", "--replica_config_model_name", "meta-llama/Llama-3-8B",
               "--replica_config_device", "h100", "--replica_scheduler_config_type", "vllm",
               "--vllm_scheduler_config_batch_size_cap", "512", "--request_generator_config_type", "trace_replay",
               "--trace_request_generator_config_trace_file", str(trace),
               # its defaults rescale a trace (prompts x0.3, times x0.04): replay ours as it is
               "--trace_request_generator_config_prefill_scale_factor", "1",
               "--trace_request_generator_config_decode_scale_factor", "1",
               "--trace_request_generator_config_time_scale_factor", "1",
               "--metrics_config_output_dir", str(Path(tmp) / "out")]
        try:
            run_tool(cmd, cwd=tmp)
            values = parse_vidur(Path(tmp) / "out", sum(r.sampling_params.max_tokens for r in requests))
        except (RuntimeError, StopIteration, KeyError) as error:
            return Prediction(tool, scenario.name, runtime_s=time.perf_counter() - started,
                              note=f"did not run: {str(error)[:300]}")
    return Prediction(tool, scenario.name, values, time.perf_counter() - started)
