"""The TP transfer: a cost model measured at tensor-parallel size 1, priced at tp_size N > 1.

The profiled model is fitted to an engine running on one GPU. At N GPUs, rank 0's step is

    host + device(TP=1) x r + communication

- host: the step's host work (building the batch, launching; plus the loop's scheduling between
  steps where the profile measured it). It does not shrink: rank 0's Python does it whatever N.
  A step run on its own (steps run one at a time, async_scheduling=false, or the first step
  after the device went idle: drained()) adds host and device times. Overlapped (async
  scheduling, on by default at any N: the engine queues step N+1 on every rank while step N
  runs) a profile that measured launches (an overlapping ProfiledCostModel) hides them behind the
  step before, by the TP=1 model's own rule (ProfiledCostModel.overlapped) with the sharded
  device time and the communication in place of the TP=1 device time; other bases add as above.
- device(TP=1) x r: the device time at TP=1, times the roofline's ratio of sharded work per GPU,
  r = (linear + attention + LM head at N) / (the same at 1), each phase max(compute, memory) of
  one rank's shard. r is ~1/N; more where a shard is not 1/N of the work (KV heads replicated
  when N > num_kv_heads, replicated norms, weight reads that stop dominating a small batch).
- communication: the roofline's collectives at N (RooflineCostModel.communication_time): two
  ring all-reduces per layer and one after the embedding, of num_tokens x hidden x dtype bytes,
  each moving 2 (N - 1) / N of the data over the GPU's link (hardware.interconnect_bandwidth x
  interconnect_efficiency) plus a latency each, or the one-shot launches of execution.all_reduce
  where they apply; the ranks' best tokens exchanged for sampling, or the sampled rows' logits
  gathered where a row filters by top-k or top-p (sim.roofline_comm.gathers_logits).

How the TP=1 step splits into host and device:
- a ProfiledCostModel of an overlapping engine (fits of launch_s and gpu_s per regime): host =
  the launch time (building the batch, launching) + launch_delay_s (the loop's work before a
  launch: reading the previous result, update(), schedule(); fitted on real steps by
  harness.calibration.fit), device = the device time alone. Its host fit is left out: under
  overlap it measured how long the device sat idle, a consequence of the host work, not more of it;
- a ProfiledCostModel without those fits: host = the hardware config's step_overhead_s +
  seq_overhead_s x num_seqs (RooflineCostModel.host_time) + its host fit (the loop's time
  between steps, measured as the steps ran one at a time), device = the rest of the executor time;
- any other model (the roofline): host = the hardware config's figures, device = the rest.
Applied to the roofline at TP=1, the transfer gives the roofline at N exactly.

Not modelled (the 2 x H200 validation in experiments/tp/ measures what they cost together): the
hand-off of each step's batch from rank 0 to the other ranks, the broadcast of the sampled ids
when steps overlap and rank 0 alone sampled, and all-reduces slower than the link's bandwidth at small messages beyond
the fixed latency. Against the engine on 2 x H200 with overlapped TP=2 steps (Qwen3-8B bench,
experiments/tp/README.md): +5.3% with NCCL's all-reduce, +6.9% and +8.9% for NCCL and the
one-shot all-reduce measured side by side in a later call.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from engine.core.plan import StepPlan
from sim.features import step_features
from sim.profiled import ProfiledCostModel
from sim.roofline import RooflineCostModel
from sim.roofline_comm import gathers_logits
from sim.specs import HardwareSpec, ModelSpec

if TYPE_CHECKING:  # sim.cost_model builds this model: a runtime import would be a circle
    from sim.cost_model import CostModel

_token_ids = attrgetter("token_ids")
_sample = attrgetter("sample")


class TPTransferCostModel:
    """base: a cost model of the engine at TP=1 (anything with step_time(plan)); prices its steps
    at tp_size ranks as the module docstring says."""

    def __init__(self, base: CostModel, model: ModelSpec, hardware: HardwareSpec, tp_size: int,
                 all_reduce: str = "nccl", routing_skew: float = 0.0, expert_parallel: bool = False) -> None:
        model.check_tp(tp_size)
        self.base = base
        self.tp_size = tp_size
        self._one = RooflineCostModel(model, hardware, 1, routing_skew=routing_skew)
        self._many = RooflineCostModel(model, hardware, tp_size, all_reduce, routing_skew, expert_parallel)
        # the profile that prices overlapped steps, where the base is one
        self._overlapped = base if isinstance(base, ProfiledCostModel) and base.prices_overlap else None
        # overlapped steps: the previous step's price and its launch time (None: nothing in flight)
        self._previous: tuple[float, float] | None = None

    def terms(self, plan: StepPlan) -> dict[str, float]:
        """The step's parts in seconds (host + device + communication is its price run on its
        own): host, device_tp1 (the TP=1 device time), shard_ratio (r), device (device_tp1 x r),
        communication; launch (the host time of its launches alone: an overlapping profile's
        launch_s, 0 otherwise)."""
        num_tokens = sum(map(len, map(_token_ids, plan.scheduled)))
        num_sampled = sum(map(_sample, plan.scheduled))
        config_host = self._one.host_time(len(plan.scheduled))
        sharded_one = self._one.step_time(plan) - config_host
        comm = self._many.communication_time(num_tokens, num_sampled, bool(num_sampled) and gathers_logits(plan))
        sharded_many = self._many.step_time(plan) - comm - config_host
        ratio = sharded_many / sharded_one if sharded_one > 0 else 1.0 / self.tp_size
        host, device_one, launch = self._split(plan, config_host)
        return {"host": host, "device_tp1": device_one, "shard_ratio": ratio, "device": device_one * ratio,
                "communication": comm, "launch": launch}

    def drained(self) -> None:
        """Nothing in flight: the next step pays its host time whole; the base model learns it too."""
        self._previous = None
        self.base.drained()

    @property
    def prices_lead(self) -> bool:
        """The base model's (ProfiledCostModel.prices_lead): its steps at TP size 1 hold the lead."""
        return bool(getattr(self.base, "prices_lead", False))

    def step_time(self, plan: StepPlan) -> float:
        terms = self.terms(plan)
        device = terms["device"] + terms["communication"]
        duration = terms["host"] + device
        if self._overlapped is not None and terms["launch"] > 0:
            launch = terms["launch"]
            # step 0 is a new run's first step (a fresh scheduler): nothing before it to hide behind
            previous = self._previous if plan.stats.step else None
            if previous is not None:
                free = max(0.0, previous[0] - previous[1] - self._overlapped.launch_delay_s)
                duration = max(device, launch - min(max(0.0, launch - device), free))
            self._previous = (duration, launch)
        return duration

    def _split(self, plan: StepPlan, config_host: float) -> tuple[float, float, float]:
        """(host, device, launch) seconds of the step at TP=1, run on its own (nothing overlapped)."""
        base = self.base
        if isinstance(base, ProfiledCostModel):
            features = step_features(plan, base.graphs, base.distinct_experts, base.shared_prefix_routing)
            launch, gpu = base.overlap_parts(features)
            if gpu > 0:
                return launch + base.launch_delay_s, gpu, launch
            executor = base.predict_features(features)
            return config_host + base.host_time(features), max(executor - config_host, 0.0), 0.0
        return config_host, max(base.step_time(plan) - config_host, 0.0), 0.0
