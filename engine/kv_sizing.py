"""How many KV-cache blocks fit on a device, from a measured memory profile.

    usable = total * gpu_memory_utilization
    kv     = usable - non_torch - weights - other - peak_activations - graph_reserve - staging
    blocks = kv // block_bytes

non_torch is device memory held outside PyTorch's allocator (CUDA context, NCCL buffers, other
processes): it is part of what the engine uses, so it counts against the utilisation too.
weights are the model's parameters and buffers; other is what else this process's allocator held
before the warm-up (rotary tables, and anything an earlier engine still alive or the caller left).
peak_activations is what a warm-up at the largest batch (a full prefill budget, a full decode
batch through the sampler's costliest path) made the allocator reserve on top of the weights.
graph_reserve is set aside for the CUDA-graph memory pool, which is captured after the cache
is allocated; one pool serves every captured batch size and the largest is captured first, so
the decode forward's own peak at the largest batch bounds it. staging is what a disaggregated
replica's KV link holds for transfers in flight (engine.core.kv_staging; 0 otherwise).

On CPU there is nothing to profile: a fixed budget (cpu_kv_blocks).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from engine.core.config import SchedulerConfig
from engine.core.plan import ScheduledRequest, StepPlan, StepStats
from engine.core.sampling_params import SamplingParams
from engine.moe_warmup import moe_warmup_counts

log = logging.getLogger(__name__)

# Default KV-cache budget on CPU when CacheConfig.num_blocks is None. CPU runs are for
# correctness and small experiments; a fixed budget keeps them from taking the host's memory.
CPU_KV_CACHE_BYTES = 512 * 1024**2

# Tensors held besides the model past this are worth naming in the error: they are another engine
# or the caller's, not the engine's own small tables.
OTHER_TENSORS_HINT_BYTES = 1024**3


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype | None) -> torch.dtype | None:
    """What the KV cache holds for CacheConfig.kv_cache_dtype (engine.core.config.KV_CACHE_DTYPES):
    fp8 is float8 e4m3, which the attention backends convert as they read it."""
    return torch.float8_e4m3fn if kv_cache_dtype == "fp8" else model_dtype


def cpu_kv_blocks(block_bytes: int, max_blocks_per_seq: int, max_num_seqs: int) -> int:
    """Every running sequence at full length, within CPU_KV_CACHE_BYTES, but never less than one
    full-length sequence (the scheduler would reject any request that cannot fit alone)."""
    return max(max_blocks_per_seq, min(max_blocks_per_seq * max_num_seqs, CPU_KV_CACHE_BYTES // block_bytes))


@dataclass(frozen=True)
class MemoryProfile:
    total_bytes: int  # device memory as the driver reports it
    non_torch_bytes: int  # held outside PyTorch's allocator
    weights_bytes: int  # the model's parameters and buffers
    peak_activation_bytes: int  # warm-up's reserved memory above the weights (temporary cache excluded)
    graph_reserve_bytes: int  # set aside for the CUDA-graph pool (0 when no graphs are captured)
    staging_bytes: int = 0  # a disaggregated replica's KV link staging (engine.core.kv_staging)
    other_bytes: int = 0  # held besides the model before the warm-up (allocator rounding included)

    def kv_budget_bytes(self, utilization: float) -> float:
        used = (self.non_torch_bytes + self.weights_bytes + self.other_bytes + self.peak_activation_bytes
                + self.graph_reserve_bytes + self.staging_bytes)
        return self.total_bytes * utilization - used

    def describe(self, utilization: float) -> str:
        gib = 1024**3
        return (f"total {self.total_bytes / gib:.2f} GiB x {utilization} = {self.total_bytes * utilization / gib:.2f} "
                f"GiB usable; non-torch {self.non_torch_bytes / gib:.2f}, weights {self.weights_bytes / gib:.2f}, "
                f"other tensors {self.other_bytes / gib:.2f}, peak activations {self.peak_activation_bytes / gib:.2f}, "
                f"graph reserve {self.graph_reserve_bytes / gib:.2f}, "
                f"KV link staging {self.staging_bytes / gib:.2f} GiB; "
                f"KV cache {self.kv_budget_bytes(utilization) / gib:.2f} GiB")


def num_kv_blocks(profile: MemoryProfile, utilization: float, block_bytes: int, min_blocks: int) -> int:
    """Blocks that fit the profile's KV budget; ValueError when fewer than min_blocks (one
    max_model_len sequence) fit, since the scheduler could then never admit a long request."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes must be > 0, got {block_bytes}")
    blocks = int(max(profile.kv_budget_bytes(utilization), 0) // block_bytes)
    if blocks < min_blocks:
        others = (f". This process held {profile.other_bytes / 1024**3:.2f} GiB of tensors besides this model "
                  "before it started: shut down an earlier engine (LLM.shutdown()) or free the caller's CUDA "
                  "tensors" if profile.other_bytes > OTHER_TENSORS_HINT_BYTES else "")
        raise ValueError(
            f"gpu_memory_utilization={utilization} leaves room for {blocks} KV blocks, fewer than one "
            f"max_model_len sequence needs ({min_blocks}): {profile.describe(utilization)}{others}. Raise "
            "gpu_memory_utilization, or lower max_model_len / max_num_batched_tokens / max_num_seqs"
        )
    return blocks


def profiled_kv_blocks(profile: MemoryProfile, utilization: float, block_bytes: int, block_size: int,
                       min_blocks: int) -> int:
    """num_kv_blocks, logged with the profile behind it."""
    blocks = num_kv_blocks(profile, utilization, block_bytes, min_blocks)
    log.info("KV cache: %d blocks of %d tokens (%.2f GiB); %s", blocks, block_size, blocks * block_bytes / 1024**3,
             profile.describe(utilization))
    return blocks


def warmup_plans(config: SchedulerConfig, block_size: int) -> tuple[StepPlan, StepPlan, StepPlan, StepPlan]:
    """The largest steps the scheduler can produce: a prefill of max_num_batched_tokens tokens in
    sequences of up to max_model_len, the same budget over as many short sequences as
    max_num_seqs allows (kernels pick other tile shapes for short queries: compiling them here
    keeps compilation out of the first real steps), and a decode of max_num_seqs rows sampled
    with top-p (the sampler's sort path); then the same decode sampled by temperature alone with a
    seed per row, the sampler kernel's other variant (without it, a bench's first step compiled
    it: 0.47 s instead of 0.036 s on an H100, experiments/calibration/first_step_probe.py). Every
    sequence shares one table of blocks 0..n-1, so a cache of one max_model_len sequence serves
    the warm-up."""
    table = list(range(-(-config.max_model_len // block_size)))
    params = SamplingParams(temperature=1.0, top_p=0.9)
    budget, max_len, max_seqs = config.max_num_batched_tokens, config.max_model_len, config.max_num_seqs
    lengths, left = [], budget
    while left > 0 and len(lengths) < max_seqs:
        lengths.append(min(left, max_len))
        left -= lengths[-1]
    short = max(2, min(max_len, budget // max_seqs))
    short_lengths = [short] * max(1, min(max_seqs, budget // short))

    def plan(lens: list[int], kind: str, seeded: bool = False) -> StepPlan:
        return warmup_plan(lens, kind, table, params, seeded)

    decode = [1] * max_seqs
    return (plan(lengths, "prefill"), plan(short_lengths, "prefill"), plan(decode, "decode"),
            plan(decode, "decode", True))


def warmup_plan(lens: list[int], kind: str, table: list[int], params: SamplingParams,
                seeded: bool = False) -> StepPlan:
    """A step of sequences of `lens` tokens (decode: one each) over one shared block table."""
    entries = [ScheduledRequest(f"warmup-{i}", [0] * n, 0, table, True,
                                SamplingParams(temperature=0.7, seed=i) if seeded else params, 0, kind == "decode")
               for i, n in enumerate(lens)]
    tokens = sum(lens)
    return StepPlan(entries, StepStats(0, kind, len(entries), 0 if kind == "decode" else tokens,
                                       tokens if kind == "decode" else 0, 0, 0, 0, 0, 0))


def moe_warmup_plans(config: SchedulerConfig, block_size: int, counts: tuple[int, ...]) -> list[StepPlan]:
    """A greedy eager prefill of each token count in counts (engine.moe_warmup), in sequences of up
    to max_model_len tokens sharing blocks 0..n-1, as warmup_plans' are."""
    table = list(range(-(-config.max_model_len // block_size)))
    plans = []
    for count in counts:
        lens = [config.max_model_len] * (count // config.max_model_len)
        lens += [count % config.max_model_len] if count % config.max_model_len else []
        plan = warmup_plan(lens, "prefill", table, SamplingParams(temperature=0.0))
        plan.use_cuda_graphs = False  # eagerly, as a step no captured graph holds runs
        plans.append(plan)
    return plans


def run_moe_warmup(runner) -> None:
    """Run moe_warmup_plans over the runner's allocated cache (no-op for a dense model): every
    fused-MoE launch variant is compiled before a step can meet it. Logs how long it took."""
    counts = moe_warmup_counts(runner.model, runner.device, runner.scheduler_config.max_num_batched_tokens)
    if not counts:
        return
    start = time.perf_counter()
    with torch.inference_mode():
        for plan in moe_warmup_plans(runner.scheduler_config, runner.block_size, counts):
            runner.execute(plan)
    torch.cuda.synchronize(runner.device)
    log.info("fused-MoE warm-up: prefills of %s tokens in %.2f s", list(counts), time.perf_counter() - start)


def tensor_bytes(*tensors: Iterable[torch.Tensor], device: torch.device) -> int:
    """Bytes of the distinct storages behind the tensors on device (tied weights share one)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for group in tensors for t in group
                if t.device.type == device.type and device.index in (None, t.device.index)}
    return sum(storages.values())


def profile_memory(runner, graph_reserve: bool) -> MemoryProfile:
    """Run the largest steps (warmup_plans) on a ModelRunner, over a temporary one-sequence
    cache, and measure what they take on top of the weights. The runner's cache is freed.

    NOTE: activations are counted as the allocator's reserved memory, not its allocated
    peak: freed blocks stay cached and do not always fit the next request, and on the first
    H100 runs the engine held ~3 GiB more than the allocated peak predicted.
    """
    dev = runner.device
    runner.free_kv_cache()
    torch.cuda.synchronize(dev)
    gc.collect()  # an earlier engine in a reference cycle holds its cache until it is collected
    torch.cuda.empty_cache()
    held = max(torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev))  # with the allocator's rounding
    weights = min(tensor_bytes(runner.model.parameters(), runner.model.buffers(), device=dev), held)
    base = torch.cuda.memory_reserved(dev)
    runner.allocate_kv_cache(runner.max_blocks_per_seq)
    temp = torch.cuda.memory_reserved(dev) - base
    prefill, short_prefill, decode, seeded_decode = warmup_plans(runner.scheduler_config, runner.block_size)
    with torch.inference_mode():
        runner.execute(prefill)
        runner.execute(short_prefill)
        # The decode forward alone bounds the graph pool; the sampler's sort comes after it.
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        runner.forward(runner.prepare(decode))
        torch.cuda.synchronize(dev)
        forward_peak = torch.cuda.max_memory_allocated(dev) - before
        runner.execute(decode)
        runner.execute(seeded_decode)
        torch.cuda.synchronize(dev)
    # reserved memory only grows until empty_cache(): now it is the warm-up's whole footprint
    peak = torch.cuda.memory_reserved(dev) - base - temp
    run_moe_warmup(runner)  # after the peak is read: steps no larger than the budget's, not counted
    runner.free_kv_cache()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(dev)
    return MemoryProfile(
        total_bytes=total,
        non_torch_bytes=max(0, total - free - torch.cuda.memory_reserved(dev)),
        weights_bytes=weights,
        other_bytes=held - weights,
        peak_activation_bytes=max(peak, 0),
        graph_reserve_bytes=forward_peak if graph_reserve else 0,
    )


def warm_up(runner) -> bool:
    """Run the largest steps (warmup_plans) once over a ModelRunner's allocated cache, so that
    kernel compilation and first-use costs land here, not in a measured run's first steps
    (2.7 s on the first step of an H100 run with a pinned block count). Profiling does this
    when it sizes the cache; call it when the block count was given. Needs a cache of at
    least one max_model_len sequence (the plans share blocks 0..n-1); False when smaller."""
    if runner.kv_cache is None or runner.num_blocks < runner.max_blocks_per_seq:
        return False
    with torch.inference_mode():
        for plan in warmup_plans(runner.scheduler_config, runner.block_size):
            runner.execute(plan)
    run_moe_warmup(runner)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return True
