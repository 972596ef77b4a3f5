"""Expert parallelism's one rule, shared by the engine (which places the experts) and the
simulator (which prices the placement): with ExecutionConfig.expert_parallel each of the
tensor_parallel_size ranks holds num_experts / tensor_parallel_size whole experts, so the model
must be a mixture of experts whose expert count the group divides."""

from __future__ import annotations

from engine.core.model_shapes import ModelShape


def check_expert_parallel(shape: ModelShape, tensor_parallel_size: int, expert_parallel: bool) -> None:
    """ValueError (one line) where expert_parallel cannot place `shape`'s experts over the group."""
    if not expert_parallel:
        return
    if not shape.is_moe:
        raise ValueError(f"execution.expert_parallel=true needs a mixture-of-experts model; {shape.name!r} "
                         "is dense (num_experts 0): set it false")
    if shape.num_experts % tensor_parallel_size:
        raise ValueError(f"execution.expert_parallel: num_experts={shape.num_experts} of {shape.name!r} must be "
                         f"divisible by tensor_parallel_size={tensor_parallel_size}")


def experts_per_rank(shape: ModelShape, tensor_parallel_size: int, expert_parallel: bool) -> int:
    """Whole experts one rank holds: all of them (each sliced) without expert parallelism."""
    check_expert_parallel(shape, tensor_parallel_size, expert_parallel)
    return shape.num_experts // tensor_parallel_size if expert_parallel else shape.num_experts
