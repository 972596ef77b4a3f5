"""The static peers of experiments/peers/compare_peers.py: NVIDIA's AIConfigurator and GenZ, each
an estimator of one steady batch, run from its own virtual environment."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from experiments.peers.common import Prediction, Scenario, run_tool

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
        return parse_aic((run or run_tool)(cmd))
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
        return json.loads((run or run_tool)(cmd).strip().splitlines()[-1])
    return estimate
