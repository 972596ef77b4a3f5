"""A Triton GEMM for decode-sized row counts, y = x @ w.T, meant to read the weight near the memory
bound where cuBLAS does not (experiments/kernels/skinny_gemm.py measures the two).

On an H100 cuBLAS takes 6-8 us for each decode projection of Qwen3-0.6B whatever its size (o_proj
reads its 4 MB at 0.22 of the copy ceiling: experiments/norm_linear/h100_run1/decode_gemms.txt),
most likely because it launches too few CTAs for a few rows to keep enough loads in flight. Here
the output is cut into narrow column tiles (BLOCK_N 32-128) and, where that still leaves the SMs
short of work, K is split between programs as well (SPLIT_K).

NOTE: split-K stays one launch, since the launch count is what the decode step pays for. Each
program stores its fp32 partial tile in a caller-owned workspace and counts itself in on its
output tile's arrival counter; the program that arrives last sums the partials in split order
0..SPLIT_K-1 (the same order whichever program is last, so results are deterministic), writes y
and sets the counter back to zero, so the next launch or CUDA-graph replay starts clean.

Measured on an H100 (experiments/norm_linear/README.md): up to 10% faster than cuBLAS per layer
at 1-8 rows, 1.3-1.8x slower at the bench's 140; a kernel with a dependent chain of memory reads
costs ~5 us in a graph whatever it reads. The engine does not use it. `pdl=True` launches it as a
programmatic dependent of the kernel ahead (pdl_chain.py measures that too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.validation import SUPPORTED_DTYPES

MAX_SPLIT_K = 64


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for name, value in (("block_m", self.block_m), ("block_n", self.block_n), ("block_k", self.block_k)):
            # tl.dot's operands are at least 16 wide and tl.arange needs powers of two
            if value < 16 or value & (value - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {value}")
        if not 1 <= self.split_k <= MAX_SPLIT_K:
            raise ValueError(f"GemmConfig.split_k must be in [1, {MAX_SPLIT_K}], got {self.split_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"GemmConfig.num_stages must be >= 1, got {self.num_stages}")

    def label(self) -> str:
        return (f"m{self.block_m}/n{self.block_n}/k{self.block_k}/s{self.split_k}"
                f"/w{self.num_warps}/st{self.num_stages}")

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return triton.cdiv(m, self.block_m), triton.cdiv(n, self.block_n), self.split_k

    def shared_memory_bytes(self, element_size: int) -> int:
        """An upper estimate of the pipeline's buffers: one x and one w tile per stage."""
        return self.num_stages * (self.block_m + self.block_n) * self.block_k * element_size


def rows_block(m: int) -> int:
    """BLOCK_M for m rows: the smallest of 16/32/64 that covers them, 64 beyond. Taller tiles
    would re-read less of the weight from L2 but leave fewer tiles to spread over the SMs."""
    return 16 if m <= 16 else 32 if m <= 32 else 64


def warps_for(block_m: int, block_n: int) -> int:
    return 8 if block_m * block_n >= 64 * 128 else 4


def default_config(m: int, n: int, k: int, num_sms: int, element_size: int = 2) -> GemmConfig:
    """A config giving roughly one to two programs per SM: narrower column tiles first (down to
    32), then split-K while the tiles stay below 3/4 of the SMs and each split keeps two K steps."""
    block_m = rows_block(m)
    m_tiles = triton.cdiv(max(m, 1), block_m)
    block_n = 128
    while block_n > 32 and m_tiles * triton.cdiv(n, block_n) < num_sms:
        block_n //= 2
    tiles = m_tiles * triton.cdiv(n, block_n)
    block_k = 128 if element_size <= 2 else 64
    split_k = 1
    while split_k < 8 and 4 * tiles * split_k < 3 * num_sms and triton.cdiv(k, block_k) >= 4 * split_k:
        split_k *= 2
    return GemmConfig(block_m, block_n, block_k, split_k, warps_for(block_m, block_n),
                      num_stages=4 if element_size <= 2 else 3)


def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


class SkinnyGemmWorkspace:
    """The split-K launches' fp32 partial tiles and int32 per-output-tile arrival counters, owned
    by the caller. Sized explicitly with reserve() (which may reallocate: call it before a
    CUDA-graph capture, never during one); skinny_linear only checks it. One workspace serves
    launches that run one after another on a stream (every layer of a step), not concurrent ones."""

    def __init__(self, device: torch.device | str) -> None:
        # the allocated tensor's device carries the index that a bare "cuda" leaves out
        self.device = torch.empty(0, device=device).device
        self.partials = torch.empty(0, dtype=torch.float32, device=self.device)
        self.counters = torch.zeros(0, dtype=torch.int32, device=self.device)

    @staticmethod
    def sizes(m: int, n: int, config: GemmConfig) -> tuple[int, int]:
        """(fp32 partial elements, counters) one launch with m rows, n columns and config needs."""
        m_tiles, n_tiles, splits = config.grid(m, n)
        if splits == 1:
            return 0, 0
        return m_tiles * n_tiles * splits * config.block_m * config.block_n, m_tiles * n_tiles

    def reserve(self, m: int, n: int, config: GemmConfig) -> SkinnyGemmWorkspace:
        partials, counters = self.sizes(m, n, config)
        if partials > self.partials.numel():
            self.partials = torch.empty(partials, dtype=torch.float32, device=self.device)
        if counters > self.counters.numel():
            self.counters = torch.zeros(counters, dtype=torch.int32, device=self.device)
        return self

    def reset(self) -> None:
        """Zero the counters (only needed after a launch that did not run to completion)."""
        self.counters.zero_()

    def check(self, m: int, n: int, config: GemmConfig, device: torch.device) -> None:
        partials, counters = self.sizes(m, n, config)
        if self.device != device:
            raise ValueError(f"skinny_linear: workspace is on {self.device}, x on {device}")
        if partials > self.partials.numel() or counters > self.counters.numel():
            raise ValueError(f"skinny_linear: workspace holds {self.partials.numel()} partials and "
                             f"{self.counters.numel()} counters, {m}x{n} with {config.label()} needs "
                             f"{partials} and {counters}: call workspace.reserve(m, n, config) first")


@triton.jit(do_not_specialize=["M"])
def _skinny_gemm_kernel(
    x_ptr, w_ptr, y_ptr, partial_ptr, counter_ptr,
    M, N, K, k_steps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, USE_GDC: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
):  # fmt: skip
    if PREFETCH:
        # weights never depend on the kernel ahead: start pulling this program's into L2 before
        # waiting for it, so the wait and the weight reads overlap
        _prefetch_weights(w_ptr, tl.program_id(1), tl.program_id(2), k_steps, N, K, BLOCK_N, BLOCK_K)
    if USE_GDC:
        # Programmatic dependent launch: this grid may be resident before the kernel ahead of it
        # ends; it waits here until that kernel's writes are visible, and at once lets the kernel
        # behind it launch too, so launches overlap the work instead of following it.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # Row tiles vary fastest, so the programs that share a weight tile run together and the weight
    # is read from memory about once (the other row tiles find it in L2).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _partial_product(x_ptr, w_ptr, rm, rn, pid_k, k_steps, M, N, K,
                           BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION)
    if SPLIT_K == 1:
        _store_output(y_ptr, acc, rm, rn, M, N)
    else:
        _merge_splits(y_ptr, partial_ptr, counter_ptr, acc, rm, rn, pid_m * tl.num_programs(1) + pid_n,
                      pid_k, M, N, BLOCK_M, BLOCK_N, SPLIT_K)


@triton.jit
def _prefetch_weights(w_ptr, pid_n, pid_k, k_steps, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """An L2 prefetch of every 128-byte line of the program's weight slice (bf16: 64 columns)."""
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    lines = pid_k * k_steps * BLOCK_K + tl.arange(0, BLOCK_K // 64) * 64
    for _ in range(0, k_steps):
        ok = (rn < N)[:, None] & (lines < K)[None, :]
        ptrs = tl.where(ok, w_ptr + rn.to(tl.int64)[:, None] * K + lines[None, :], w_ptr)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)
        lines += BLOCK_K


@triton.jit
def _partial_product(x_ptr, w_ptr, rm, rn, pid_k, k_steps, M, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
    """x[rm, ks] @ w[rn, ks].T in fp32 over split pid_k's k_steps K tiles; columns past K read 0
    (the last split may run past K, or start there when K is short)."""
    rk = pid_k * k_steps * BLOCK_K + tl.arange(0, BLOCK_K)
    m_ok = (rm < M)[:, None]
    n_ok = (rn < N)[:, None]
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :]  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, k_steps):
        k_ok = (rk < K)[None, :]
        a = tl.load(x_ptrs, mask=m_ok & k_ok, other=0.0)
        b = tl.load(w_ptrs, mask=n_ok & k_ok, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
        rk += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc


@triton.jit
def _store_output(y_ptr, acc, rm, rn, M, N):
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _merge_splits(y_ptr, partial_ptr, counter_ptr, acc, rm, rn, tile, pid_k, M, N,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    """Store this split's partial; the last of the tile's SPLIT_K programs to arrive sums them."""
    # partials: [tiles, SPLIT_K, BLOCK_M, BLOCK_N], each tile's splits side by side in L2
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tile_partials = partial_ptr + tile.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tl.store(tile_partials + pid_k * (BLOCK_M * BLOCK_N) + local, acc)
    # NOTE: the barrier makes every thread's partial stores precede the arrival, which one thread
    # performs with release semantics at GPU scope (cumulative over what the CTA's barrier
    # ordered before it); the last program's acquire on the same counter then orders its loads
    # after all SPLIT_K programs' stores. The loads go past L1 (.cg), which is not coherent.
    tl.debug_barrier()
    counter = counter_ptr + tile
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
        total = tl.load(tile_partials + local, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT_K):
            total += tl.load(tile_partials + s * (BLOCK_M * BLOCK_N) + local, cache_modifier=".cg")
        _store_output(y_ptr, total, rm, rn, M, N)
        # every program of the tile has arrived, so nothing else touches the counter this launch
        tl.store(counter, 0)


def _check_args(x: torch.Tensor, weight: torch.Tensor, config: GemmConfig,
                workspace: SkinnyGemmWorkspace | None) -> None:
    if not isinstance(config, GemmConfig):
        raise ValueError(f"skinny_linear: config must be a GemmConfig, got {type(config).__name__}")
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"skinny_linear: x must be [M, K] and weight [N, K], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"skinny_linear: x has K={x.shape[1]} columns but weight {tuple(weight.shape)} "
                         f"has K={weight.shape[1]}")
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"skinny_linear: x and weight must share a dtype in {SUPPORTED_DTYPES}, got "
                         f"{x.dtype} and {weight.dtype}")
    if not x.is_contiguous() or not weight.is_contiguous():
        raise ValueError("skinny_linear: x and weight must be contiguous (row-major, nn.Linear's layout)")
    if weight.device != x.device:
        raise ValueError(f"skinny_linear: x is on {x.device} but weight on {weight.device}")
    if config.split_k > 1:
        if workspace is None:
            raise ValueError(f"skinny_linear: split_k={config.split_k} needs a SkinnyGemmWorkspace")
        workspace.check(x.shape[0], weight.shape[0], config, x.device)
    if x.device.type != "cuda" and not triton.knobs.runtime.interpret:
        raise ValueError(f"skinny_linear: tensors must be on a CUDA device (or run with TRITON_INTERPRET=1), "
                         f"got {x.device}")


def skinny_linear(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K], nn.Linear's layout
    config: GemmConfig,
    workspace: SkinnyGemmWorkspace | None = None,  # needed when config.split_k > 1
    pdl: bool = False,  # launch as a programmatic dependent of the kernel ahead (Hopper and later)
    prefetch: bool = False,  # with pdl: prefetch the weights into L2 before waiting for the kernel ahead
) -> torch.Tensor:  # [M, N] in x's dtype
    """x @ weight.T with fp32 accumulation, in one launch whatever config.split_k is. Checks
    shapes only (no device sync), so it can be captured in a CUDA graph."""
    _check_args(x, weight, config, workspace)
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0 or k == 0:
        return y.zero_()
    steps = triton.cdiv(triton.cdiv(k, config.block_k), config.split_k)  # K tiles per split
    partials, counters = (workspace.partials, workspace.counters) if config.split_k > 1 else (y, y)
    _skinny_gemm_kernel[config.grid(m, n)](
        x, weight, y, partials, counters, m, n, k, steps,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=config.split_k,
        # float32 inputs get float32 products (tf32 would round them to 10 bits)
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", USE_GDC=pdl, PREFETCH=pdl and prefetch,
        num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y
