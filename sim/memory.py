"""Memory planner: how many KV-cache blocks fit on each rank next to the weights and activations.

num_blocks = (mem_bytes * gpu_memory_utilization - weights per rank - activation reserve - staging)
             // (block_size * KV bytes per token per rank)

staging is a disaggregated replica's KV link staging, staging_blocks blocks of this cache's layout
(engine.core.kv_staging.link_staging_blocks; the engine keeps it out of its profiled budget the
same way: engine.kv_sizing.MemoryProfile.staging_bytes); 0 for an aggregated replica.

The weights of a mixture-of-experts model are all its experts' (every rank holds its shard of
each expert: sim.specs.ModelSpec.body_params_per_rank), not the active parameters.

Every rank holds the same number of blocks (each keeps its share of the KV heads), so the count
is per rank and equals the scheduler's block count. An engine run profiles its real peak instead;
to replay an engine run exactly, pass its block count (CacheConfig.num_blocks) and skip this.
"""

from __future__ import annotations

from sim.specs import HardwareSpec, ModelSpec

# CUDA context, cuBLAS/attention workspaces and allocator slack: memory the runtime reports as used
# before any tensor of ours exists. A round figure, not a measurement.
RUNTIME_RESERVE_BYTES = 512 * 2**20
_GB = 1e9


def estimate_activation_bytes(model: ModelSpec, max_num_batched_tokens: int = 16384, max_num_seqs: int = 512,
                              tp_size: int = 1) -> int:
    """Peak transient memory of one step at full token budget, per rank.

    The widest point of a layer is the MLP: gate/up output (2 * intermediate), the activated
    product (intermediate) and the residual stream and its normed copy (2 * hidden) live at once.
    Sampling then holds float32 logits and probabilities for every sampled sequence. An MoE
    layer's widest point holds each token's k expert copies of gate/up output and product
    (3 k moe_intermediate), its router logits and the residual stream; the wider of the two
    kinds of layer counts.
    """
    dt = model.dtype_bytes
    per_token = (3 * model.intermediate_size // tp_size + 2 * model.hidden_size) * dt
    if model.is_moe:
        moe = 3 * model.num_experts_per_tok * (model.moe_intermediate_size // tp_size) + model.num_experts
        dense = per_token if model.num_dense_layers else 0
        per_token = max(dense, (moe + 2 * model.hidden_size) * dt)
    sampling = 2 * max_num_seqs * model.vocab_size // tp_size * 4
    return max_num_batched_tokens * per_token + sampling + RUNTIME_RESERVE_BYTES


def plan_num_blocks(
    model: ModelSpec,
    hardware: HardwareSpec,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
    tp_size: int = 1,
    max_num_batched_tokens: int = 16384,
    max_num_seqs: int = 512,
    staging_blocks: int = 0,
) -> int:
    """KV blocks per rank. activation_reserve_bytes None: estimate_activation_bytes from the budgets;
    staging_blocks: blocks of this layout kept out of the cache (a disaggregated replica's KV link)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if isinstance(gpu_memory_utilization, bool) or not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    model.check_tp(tp_size)
    if activation_reserve_bytes is None:
        activation_reserve_bytes = estimate_activation_bytes(model, max_num_batched_tokens, max_num_seqs, tp_size)
    elif activation_reserve_bytes < 0:
        raise ValueError(f"activation_reserve_bytes must be >= 0 or None, got {activation_reserve_bytes!r}")
    if isinstance(staging_blocks, bool) or not isinstance(staging_blocks, int) or staging_blocks < 0:
        raise ValueError(f"staging_blocks must be an int >= 0, got {staging_blocks!r}")
    usable = hardware.mem_bytes * gpu_memory_utilization
    weights = model.weight_bytes_per_rank(tp_size)
    block_bytes = block_size * model.kv_bytes_per_token_per_rank(tp_size)
    staging = staging_blocks * block_bytes
    free = usable - weights - activation_reserve_bytes - staging
    if free < block_bytes:
        staged = f" - {staging / _GB:.2f} GB KV link staging" if staging_blocks else ""
        raise ValueError(
            f"{model.name} does not fit on {hardware.name} with tp_size={tp_size}: "
            f"{usable / _GB:.2f} GB usable ({hardware.mem_bytes / _GB:.2f} GB x gpu_memory_utilization="
            f"{gpu_memory_utilization}) - {weights / _GB:.2f} GB weights per rank - "
            f"{activation_reserve_bytes / _GB:.2f} GB activation reserve{staged} = {free / _GB:.2f} GB, "
            f"less than one KV block ({block_bytes / _GB:.4f} GB); use more memory, a larger tp_size "
            "or a smaller model")
    return int(free // block_bytes)
