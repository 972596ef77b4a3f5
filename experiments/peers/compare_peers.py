"""Peer simulators side by side: our simulator, NVIDIA's AIConfigurator and Vidur on the same model,
GPU and workload, each beside the engine's committed measurement (docs/results.md, "Peers side by side").

    python experiments/peers/compare_peers.py --aic-venv /work/peers/aic --vidur-venv /work/peers/vidur

Our simulator runs in-process; each peer runs from its own virtual environment as a subprocess (the
project never imports a peer). A peer whose venv is not given or absent is skipped with a message;
a peer that fails is listed with its last error line instead of numbers. Errors are
(tool - engine) / engine. Writes peers.csv and peers.md to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
RUN6 = HERE.parent / "calibration" / "h100_run6" / "qwen3_8b"
METRICS = ("output_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
COMMON = ["model=qwen3-8b", "hardware=h100", "cache.num_blocks=1450", "output.progress=false"]
ENGINE_TOOL = "engine (measured)"


@dataclass(frozen=True)
class Scenario:
    """One committed engine measurement (calibration run 6, Qwen3-8B, one H100) and its workload."""
    name: str
    overrides: tuple[str, ...]
    engine_summary: Path
    rate: float | None  # requests per second; None: every request at t=0


SCENARIOS = {
    "bench": Scenario("bench", ("workload=bench", "workload.num_requests=256"),
                      RUN6 / "compare_bench" / "engine" / "summary.csv", None),
    "poisson": Scenario("poisson", ("workload=poisson", "workload.num_requests=200", "workload.rate=9.8792"),
                        RUN6 / "compare_poisson" / "engine" / "summary.csv", 9.8792),
}


@dataclass
class Prediction:
    """One tool's figures for one scenario; a metric it does not predict is absent (NaN in the table)."""
    tool: str
    scenario: str
    values: dict[str, float] = field(default_factory=dict)
    runtime_s: float = math.nan
    note: str = ""


def merge(engine: dict[str, float], predictions: Sequence[Prediction]) -> pd.DataFrame:
    """One row per tool and scenario: its figures, its error against the engine for each metric, runtime, note."""
    rows = []
    for p in predictions:
        row: dict[str, object] = {"scenario": p.scenario, "tool": p.tool}
        for m in METRICS:
            value = p.values.get(m, math.nan)
            row[m] = value
            compared = p.tool != ENGINE_TOOL and m in engine and not math.isnan(value)
            row[f"err_{m}"] = (value - engine[m]) / engine[m] if compared else math.nan
        row["runtime_s"] = p.runtime_s
        row["note"] = p.note
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    """The table as docs/results.md shows it: milliseconds for latencies, errors in percent, '-' for none."""
    head = ("| scenario | tool | output tok/s | TTFT P50 (ms) | TTFT P90 (ms) | TPOT P50 (ms) | TPOT P90 (ms) "
            "| runtime (s) |")
    lines = [head, "|" + "---|" * 8]
    for _, r in table.iterrows():
        cells = [str(r["scenario"]), str(r["tool"])]
        for m in METRICS:
            value, err = r[m], r[f"err_{m}"]
            if pd.isna(value):
                cells.append("-")
                continue
            shown = f"{value:,.0f}" if m == "output_tok_s" else f"{value * 1e3:,.1f}"
            cells.append(shown if pd.isna(err) else f"{shown} ({err:+.1%})")
        cells.append("-" if pd.isna(r["runtime_s"]) else f"{r['runtime_s']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r['scenario']}, {r['tool']}: {r['note']}" for _, r in table.iterrows() if r["note"]]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def engine_row(scenario: Scenario) -> Prediction:
    row = pd.read_csv(scenario.engine_summary).iloc[0]
    return Prediction(ENGINE_TOOL, scenario.name, {m: float(row[m]) for m in METRICS},
                      note=f"{scenario.engine_summary.relative_to(HERE.parents[1])}")


def ours(scenario: Scenario, cost_model: str) -> tuple[Prediction, list]:
    """Our simulator with the committed H100 fit (profiled) or no fit (roofline); also returns the
    requests it served (for the peers)."""
    from harness.run import run_once
    from harness.scripting import compose_run_config
    from harness.workloads.build import build_workload

    rc = compose_run_config([*COMMON, f"backend.cost_model={cost_model}", *scenario.overrides])
    requests = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size).requests
    started = time.perf_counter()
    outcome = run_once(rc, progress=False)
    runtime = time.perf_counter() - started
    row = outcome.summary.to_row()
    fit = "the committed H100 fit" if cost_model == "profiled" else "no fit"
    return Prediction(f"this project, {cost_model} ({fit})", scenario.name, {m: float(row[m]) for m in METRICS},
                      runtime), requests


AIC_TOOL = "AIConfigurator 0.12.0 (vLLM 0.24.0 database)"
GENZ_TOOL = "GenZ 0.0.16 (roofline, H100_GPU preset)"
AIC_FIELDS = {"TTFT": "ttft", "TPOT": "tpot", "Request Latency": "latency", "tokens/s": "tok_s"}


def parse_aic(text: str) -> dict[str, float]:
    """AIConfigurator's `cli estimate` report: TTFT, TPOT and request latency in ms, tokens/s (output)."""
    found = {}
    for label, key in AIC_FIELDS.items():
        match = re.search(rf"^\s*{re.escape(label)}:\s*([\d,.]+)", text, re.MULTILINE)
        if match is None:
            raise ValueError(f"AIConfigurator's report has no {label!r} line")
        found[key] = float(match.group(1).replace(",", ""))
    return found


Estimate = Callable[[int], dict[str, float]]  # batch -> ttft, tpot, latency (ms), tok_s (output tokens/s)


def steady_state(estimate: Estimate, rate: float | None, num_requests: int) -> tuple[int, dict[str, float]]:
    """A static estimator's figures for a workload: offline, one batch of every request; online, the
    batch that solves Little's law with the tool's own latency (concurrency = rate x latency)."""
    batch = num_requests if rate is None else 1
    out = estimate(batch)
    seen = {batch}
    while rate is not None:
        batch = min(num_requests, max(1, round(rate * out["latency"] / 1e3)))
        if batch in seen:
            break
        seen.add(batch)
        out = estimate(batch)
    return batch, out


def static_prediction(tool: str, estimate: Estimate, scenario: Scenario, isl: int, osl: int,
                      num_requests: int) -> Prediction:
    """A static estimator's one value per metric, shown as P50 (it predicts no distribution);
    online it predicts no throughput (a steady state serves what arrives)."""
    started = time.perf_counter()
    try:
        batch, out = steady_state(estimate, scenario.rate, num_requests)
    except (RuntimeError, ValueError) as error:
        return Prediction(tool, scenario.name, runtime_s=time.perf_counter() - started,
                          note=f"did not run: {str(error)[:300]}")
    values = {"ttft_p50_s": out["ttft"] / 1e3, "tpot_p50_s": out["tpot"] / 1e3}
    if scenario.rate is None:
        values["output_tok_s"] = out["tok_s"]
    note = (f"one value per metric (shown as P50) for a steady batch of {batch}, ISL {isl}, OSL {osl} "
            "(the workload's means)")
    return Prediction(tool, scenario.name, values, time.perf_counter() - started, note)


def aic_estimate(venv: Path, isl: int, osl: int, run: Callable[[list[str]], str] | None = None) -> Estimate:
    """AIConfigurator's `cli estimate` of Qwen3-8B on one H100 SXM, its vLLM database, aggregated serving."""
    def estimate(batch: int) -> dict[str, float]:
        cmd = [str(venv / "bin" / "aiconfigurator"), "cli", "estimate", "--model-path", "Qwen/Qwen3-8B",
               "--system", "h100_sxm", "--backend", "vllm", "--tp-size", "1", "--isl", str(isl),
               "--osl", str(osl), "--batch-size", str(batch)]
        return parse_aic((run or _run)(cmd))
    return estimate


# Runs inside GenZ's venv: Qwen3-8B's shape (engine/core/model_shapes.py, passed in) on GenZ's H100_GPU
# preset. TTFT: one prompt's prefill; TPOT: a decode step of the batch at the mean context; latency:
# both; throughput: the batch's output over its prefill and its decode steps.
GENZ_SCRIPT = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from GenZ.Models.default_models import ModelConfig
from GenZ.LLM_inference import prefill_moddeling, decode_moddeling
a = json.loads(sys.argv[1])
m = ModelConfig(model="qwen3-8b-shape", vocab_size=a["vocab"], hidden_size=a["hidden"], intermediate_size=a["ffn"],
                num_ffi=2, num_decoder_layers=a["layers"], num_attention_heads=a["heads"], head_dim=a["head_dim"],
                num_key_value_heads=a["kv_heads"])
kw = dict(model=m, system_name="H100_GPU", bits="bf16", tensor_parallel=1)
ttft = prefill_moddeling(batch_size=1, input_tokens=a["isl"], **kw)["Latency"]
prefill_all = prefill_moddeling(batch_size=a["batch"], input_tokens=a["isl"], **kw)["Latency"]
tpot = decode_moddeling(batch_size=a["batch"], input_tokens=a["isl"] + a["osl"] // 2, Bb=1, **kw)["Latency"]
print(json.dumps({"ttft": ttft, "tpot": tpot, "latency": ttft + a["osl"] * tpot,
                  "tok_s": 1e3 * a["batch"] * a["osl"] / (prefill_all + a["osl"] * tpot)}))
"""


def genz_estimate(venv: Path, isl: int, osl: int, run: Callable[[list[str]], str] | None = None) -> Estimate:
    from engine.core.model_shapes import model_shape

    shape = model_shape("qwen3-8b")
    fixed = {"vocab": shape.vocab_size, "hidden": shape.hidden_size, "ffn": shape.intermediate_size,
             "layers": shape.num_layers, "heads": shape.num_heads, "head_dim": shape.head_dim,
             "kv_heads": shape.num_kv_heads, "isl": isl, "osl": osl}

    def estimate(batch: int) -> dict[str, float]:
        cmd = [str(venv / "bin" / "python"), "-c", GENZ_SCRIPT, json.dumps({**fixed, "batch": batch})]
        return json.loads((run or _run)(cmd).strip().splitlines()[-1])
    return estimate


def _run(cmd: list[str], cwd: str | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=cwd)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise RuntimeError(f"exit {done.returncode}: {last[0]}")
    return done.stdout if done.stdout.strip() else done.stderr


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
            _run(cmd, cwd=tmp)
            values = parse_vidur(Path(tmp) / "out", sum(r.sampling_params.max_tokens for r in requests))
        except (RuntimeError, StopIteration, KeyError) as error:
            return Prediction(tool, scenario.name, runtime_s=time.perf_counter() - started,
                              note=f"did not run: {str(error)[:300]}")
    return Prediction(tool, scenario.name, values, time.perf_counter() - started)


def peer_venv(path: Path | None, name: str) -> Path | None:
    if path is None or not (path / "bin" / "python").exists():
        print(f"skipping {name}: no venv at {path} (see docs/results.md, 'Peers side by side', for the install)")
        return None
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aic-venv", type=Path, help="venv with aiconfigurator==0.12.0")
    parser.add_argument("--vidur-venv", type=Path, help="venv with vidur==0.0.26")
    parser.add_argument("--genz-venv", type=Path, help="venv with genz-llm==0.0.16")
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, default=HERE, help="folder for peers.csv and peers.md")
    args = parser.parse_args(argv)
    aic_venv, vidur_venv = peer_venv(args.aic_venv, "AIConfigurator"), peer_venv(args.vidur_venv, "Vidur")
    genz_venv = peer_venv(args.genz_venv, "GenZ")
    tables = []
    for name in args.scenarios:
        scenario = SCENARIOS[name]
        engine = engine_row(scenario)
        profiled, requests = ours(scenario, "profiled")
        predictions = [engine, profiled, ours(scenario, "roofline")[0]]
        isl = round(sum(len(r.prompt_token_ids) for r in requests) / len(requests))
        osl = round(sum(r.sampling_params.max_tokens for r in requests) / len(requests))
        if aic_venv is not None:
            predictions.append(static_prediction(AIC_TOOL, aic_estimate(aic_venv, isl, osl), scenario, isl, osl,
                                                 len(requests)))
        if genz_venv is not None:
            predictions.append(static_prediction(GENZ_TOOL, genz_estimate(genz_venv, isl, osl), scenario, isl, osl,
                                                 len(requests)))
        if vidur_venv is not None:
            predictions.append(vidur(vidur_venv, scenario, requests))
        tables.append(merge(engine.values, predictions))
    table = pd.concat(tables, ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "peers.csv", index=False)
    (args.out / "peers.md").write_text(markdown(table))
    print(markdown(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
