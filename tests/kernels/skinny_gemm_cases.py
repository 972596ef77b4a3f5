"""Checks of experiments.kernels.skinny_gemm_kernel against a float64 reference, shared by the GPU
tests (test_skinny_gemm.py) and the CPU interpreter run (interpreter_checks below, which
test_skinny_gemm.py starts in a subprocess with TRITON_INTERPRET=1: Triton reads it when the
kernel is decorated, before the module is first imported).

Inputs are fresh random tensors per call; the seed is in every failure message. Rows get very
different scales and the error is measured row by row, so a kernel that mixed up rows, dropped
a K split or left a tile unwritten fails.
"""

from __future__ import annotations

import torch

from tests.kernels.fused_cases import TOLERANCE


def make_inputs(device: str, dtype: torch.dtype, m: int, n: int, k: int,
                seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, m)[:, None]).to(dtype).to(device)  # [m, k]
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype).to(device)  # [n, k]
    return x, w


def assert_rows_close(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, what: str) -> None:
    """Each row's norm-wise relative error against x @ w.T (in float64, on x's device) within the
    dtype's bound."""
    ref = (x.double() @ w.double().T).float().cpu()  # [m, n]
    out = y.float().cpu()
    assert y.shape == ref.shape and y.dtype == x.dtype, f"{what}: got {tuple(y.shape)} {y.dtype}"
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    err = (out - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)  # [m]
    tol = TOLERANCE[x.dtype][0]
    assert (err < tol).all(), f"{what}: row {int(err.argmax())} relative error {err.max().item():.2e} >= {tol}"


def check_skinny_linear(device: str, dtype: torch.dtype, m: int, n: int, k: int, config, seed: int,
                        workspace=None) -> torch.Tensor:
    """One launch on fresh inputs, checked against the reference; the split-K counters must be
    back at zero afterwards. Returns the output."""
    from experiments.kernels.skinny_gemm_kernel import SkinnyGemmWorkspace, skinny_linear

    workspace = (workspace or SkinnyGemmWorkspace(device)).reserve(m, n, config)
    x, w = make_inputs(device, dtype, m, n, k, seed)
    before = (x.clone(), w.clone())
    y = skinny_linear(x, w, config, workspace)
    what = f"skinny_linear {m}x{k} @ {n}x{k}.T {config.label()} {dtype} seed {seed}"
    assert_rows_close(y, x, w, what)
    assert torch.equal(x, before[0]) and torch.equal(w, before[1]), what + ": inputs changed"
    assert not workspace.counters.any(), f"{what}: split-K counters left at {workspace.counters.tolist()}"
    return y


def interpreter_checks(seed: int) -> int:
    """The kernel on CPU float32 tensors under TRITON_INTERPRET=1: ragged M, N and K, splits that
    end past K or start there, each config launched twice on one workspace (the first launch's
    counters must not leak into the second) and once more on repeated inputs, which must give
    the same bits. Returns the number of launches checked."""
    from experiments.kernels.skinny_gemm_kernel import GemmConfig
    from tests.kernels.interpreter_compat import one_element_indices

    configs = [GemmConfig(16, 32, 32, 1), GemmConfig(16, 32, 32, 3), GemmConfig(32, 16, 64, 4),
               GemmConfig(16, 16, 32, 8)]
    with one_element_indices():
        return _interpreter_launches(configs, seed)


def _interpreter_launches(configs, seed: int) -> int:
    from experiments.kernels.skinny_gemm_kernel import SkinnyGemmWorkspace, skinny_linear

    launches = 0
    for m, n, k in [(5, 40, 200), (37, 72, 200), (1, 16, 48)]:
        for config in configs:
            workspace = SkinnyGemmWorkspace("cpu")
            for launch in range(2):
                check_skinny_linear("cpu", torch.float32, m, n, k, config, seed + launch, workspace)
            x, w = make_inputs("cpu", torch.float32, m, n, k, seed)
            first = skinny_linear(x, w, config, workspace)
            assert torch.equal(skinny_linear(x, w, config, workspace), first), f"{config.label()} not deterministic"
            launches += 4
    return launches
