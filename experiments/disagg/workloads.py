"""The driver's traffic: the two workload classes the fidelity cells serve, and the two planner
scenarios (one where the planner picks disaggregation on two GPUs, one where it picks aggregation)
whose goodput the engine measures.

Classes (lengths in tokens on a GPU; a CPU run of the tiny model divides the long class's by 16):
- long: prompts uniform in 2,048-6,144, outputs 100-300, Poisson arrivals;
- conversation: the Azure conversation trace's lengths (its first rows, clipped at
  max_model_len), Poisson arrivals.
Each is drained offline first (the fleet's capacity), then served at load x capacity.

Scenarios, found with the simulator (`run_disagg.py plan`: experiment=plan over 1 GPU type, TP 1,
policy mixed, 64 sequences, 8,192-token steps, least-requests routing, both modes, priced by the
shipped H100 profile). With prompts of 6-8k tokens and a tight TPOT an aggregated replica's
decodes stall behind prefill chunks, so one prefill and one decode replica beat more aggregated
ones; with short prompts and long answers one decode replica holds too many sequences while its
prefill replica idles, so two aggregated replicas beat 1P + 2D.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.workloads import LengthConfig, WorkloadConfig

CLASSES = ("long", "conversation")
LONG_LENGTHS = ((2048, 6144), (100, 300))
CPU_LENGTH_SCALE = 1 / 16
MEASURE_SCHEDULER = ("scheduler.max_model_len=8192",)  # GPU runs: the long class and all but one trace row fit


def class_workload(name: str, trace: str | None, cpu: bool) -> WorkloadConfig:
    """The class offline (its arrivals and count are set per run by at_rate)."""
    if name == "long":
        scale = CPU_LENGTH_SCALE if cpu else 1.0
        (p_lo, p_hi), (o_lo, o_hi) = ((max(1, round(a * scale)), max(1, round(b * scale))) for a, b in LONG_LENGTHS)
        return WorkloadConfig(name="long", prompt_len=LengthConfig("uniform", p_lo, p_hi),
                              output_len=LengthConfig("uniform", o_lo, o_hi))
    if name == "conversation":
        return WorkloadConfig(name="conversation", prompt_len=LengthConfig("trace"), output_len=LengthConfig("trace"),
                              trace_path=trace)
    raise ValueError(f"--workloads: unknown class {name!r}; known: {list(CLASSES)}")


def at_rate(workload: WorkloadConfig, rate: float | None, num_requests: int) -> WorkloadConfig:
    """Offline (rate None) or Poisson at rate req/s, num_requests of them."""
    if rate is None:
        return dataclasses.replace(workload, arrival="offline", rate=None, num_requests=num_requests)
    return dataclasses.replace(workload, arrival="poisson", rate=rate, num_requests=num_requests)


def request_count(rate: float, seconds: float, low: int, high: int) -> int:
    """Requests for a run of about `seconds` at `rate`, within [low, high]."""
    return int(min(high, max(low, round(rate * seconds))))


@dataclass(frozen=True)
class Scenario:
    """A workload and SLO the planner decides, and the mode it picks (`expected`)."""

    name: str
    expected: str  # "disaggregated" | "aggregated"
    prompt: tuple[int, int]
    output: tuple[int, int]
    rate: float  # req/s the planner sizes the fleet for
    ttft_s: float  # P90 TTFT SLO
    tpot_s: float  # P90 TPOT SLO
    plan_requests: int  # the planner's workload

    def workload(self, rate: float, num_requests: int, scale: float = 1.0) -> WorkloadConfig:
        (p_lo, p_hi), (o_lo, o_hi) = ((max(1, round(a * scale)), max(1, round(b * scale)))
                                      for a, b in (self.prompt, self.output))
        return WorkloadConfig(name=self.name, num_requests=num_requests, prompt_len=LengthConfig("uniform", p_lo, p_hi),
                              output_len=LengthConfig("uniform", o_lo, o_hi), arrival="poisson", rate=rate)


# The planner's settings and the engine's for the goodput runs; one engine session serves both
# scenarios, so one max_model_len on a GPU: the long prompts' 8,000 tokens and their outputs.
GOODPUT_SCHEDULER = ("scheduler.policy=mixed", "scheduler.max_num_seqs=64", "scheduler.max_num_batched_tokens=8192")
GOODPUT_MAX_MODEL_LEN = ("scheduler.max_model_len=8400",)
PLAN_SPACE = ("experiment=plan", "workload=poisson", "plan.tp_sizes=[1]", "plan.max_num_seqs=[64]",
              "plan.max_num_batched_tokens=[8192]", "plan.policies=[mixed]", "plan.routers=[least_requests]",
              "plan.modes=[aggregated,disaggregated]", "output.plots=false", "output.progress=false")

# model -> its two scenarios; the planner picks the expected mode on H100 and on H200 (profiled;
# the table is in experiments/disagg/README.md). plan_requests: enough for the fleet to reach its
# steady state (the short-prompt scenarios' 2-3 s of arrivals let 1P1D pass that 5-8 s do not).
SCENARIOS = {
    "qwen3-8b": (
        Scenario("disagg_wins", "disaggregated", (6000, 8000), (100, 200), 4.0, 2.0, 0.012, 80),
        Scenario("agg_wins", "aggregated", (100, 300), (100, 300), 65.0, 0.5, 0.015, 500),
    ),
    "qwen3-0.6b": (
        Scenario("disagg_wins", "disaggregated", (6000, 8000), (20, 60), 25.0, 0.5, 0.004, 300),
        Scenario("agg_wins", "aggregated", (100, 300), (100, 300), 200.0, 0.5, 0.004, 1000),
    ),
}
# the CPU run (tests): the 8B scenarios' shapes at 1/16 of the lengths, on the tiny model
CPU_SCENARIO_MODEL = "qwen3-8b"

