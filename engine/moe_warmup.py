"""Which token counts a mixture-of-experts engine runs at start-up so that no fused-MoE compile
lands in a served step.

The fused MoE kernels compile one variant per launch variant (kernels.moe_configs.launch_variant:
the tuned tiles of the step's token count and the alignment's scan switch); each compile takes
0.3-0.5 s of host time. Graph capture and the memory profile's steps meet only the variants of
their own sizes, so an eager step of another size could compile in the middle of a run (on an
H100 the held-out protocol's prefill_heavy cells each had one such step:
experiments/fidelity/h100_30b_r5/README.md, docs/moe-warmup.md). engine.kv_sizing runs an eager
prefill of each count returned here once at start-up: in the memory profile (after its peak is
read) or, for an engine given its block count, in its warm-up.
"""

from __future__ import annotations

import torch

from engine.layers.moe import SparseMoE
from kernels.moe_configs import warmup_token_counts


def moe_warmup_counts(model: torch.nn.Module, device: torch.device, max_tokens: int) -> tuple[int, ...]:
    """One token count per fused-MoE launch variant of steps of up to max_tokens tokens; () for a
    dense model, off CUDA, or where the layers do not run the fused kernels."""
    if device.type != "cuda":
        return ()
    layer = next((m for m in model.modules() if isinstance(m, SparseMoE)), None)
    if layer is None or layer.fused_kernels is None:
        return ()
    experts = layer.experts
    dtype = str(experts.down_proj.dtype).removeprefix("torch.")
    # expert parallelism aligns this rank's experts and one more for the others'
    align = experts.num_local + 1 if experts.is_partial else None
    return warmup_token_counts(max_tokens, layer.top_k, experts.num_experts, experts.per, dtype,
                               torch.cuda.get_device_name(device), align)
