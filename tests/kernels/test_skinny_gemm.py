"""experiments.kernels.skinny_gemm_kernel (a Triton GEMM for decode-sized row counts, with split-K
merged in the same launch) against a float64 reference of the same inputs.

On CUDA: the Qwen3-0.6B and -8B projection shapes and a ragged one, row counts from one to the
largest decode graph, every I/O dtype, every config experiments/kernels/skinny_gemm.py times, the
split-K counters over repeated launches and CUDA-graph replays with new inputs. On CPU (default
run): the argument checks (they raise before any launch), the config and workspace rules, and the
kernel itself under Triton's interpreter in a subprocess.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed
from tests.kernels.skinny_gemm_cases import assert_rows_close, check_skinny_linear, make_inputs

pytest.importorskip("triton")
from experiments.kernels import skinny_gemm_kernel as sk  # noqa: E402
from experiments.kernels.decode_gemms import MODELS, projections  # noqa: E402
from experiments.kernels.skinny_gemm import BATCHES, CANDIDATE_CONFIGS, candidates  # noqa: E402
from experiments.kernels.skinny_gemm_kernel import GemmConfig, SkinnyGemmWorkspace, skinny_linear  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# (N, K): every projection of both models, and a ragged one (no dimension a multiple of 16)
SHAPES = sorted({shape for model in MODELS for shape in projections(model).values()}) + [(200, 1000)]
SPLIT = GemmConfig(16, 32, 128, 4)


def on_cuda(test):
    for mark in needs_cuda:
        test = mark(test)
    return test


# ---- GPU ----------------------------------------------------------------------------------------


@on_cuda
@pytest.mark.parametrize("m", [1, 7, 64, 140, 512])
@pytest.mark.parametrize("n, k", SHAPES)
def test_default_config_matches_reference(m, n, k):
    config = sk.default_config(m, n, k, sk.num_sms(torch.cuda.current_device()))
    check_skinny_linear("cuda", torch.bfloat16, m, n, k, config, fresh_seed())


@on_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("m", [3, 140])
@pytest.mark.parametrize("n, k", [(1024, 2048), (200, 1000)])
def test_other_dtypes(dtype, m, n, k):
    config = sk.default_config(m, n, k, sk.num_sms(torch.cuda.current_device()), dtype.itemsize)
    check_skinny_linear("cuda", dtype, m, n, k, config, fresh_seed())


@on_cuda
@pytest.mark.parametrize("config", CANDIDATE_CONFIGS, ids=GemmConfig.label)
def test_every_measured_config_is_correct(config):
    workspace = SkinnyGemmWorkspace("cuda")
    for m in (1, config.block_m + 3, 140):
        check_skinny_linear("cuda", torch.bfloat16, m, 200, 1000, config, fresh_seed(), workspace)


@on_cuda
@pytest.mark.parametrize("config", [SPLIT, GemmConfig(64, 32, 64, 8), GemmConfig(32, 64, 128, 3, 4, 3)],
                         ids=GemmConfig.label)
def test_split_k_counters_reset_between_launches(config):
    """Fresh inputs on one workspace, launch after launch; the same inputs give the same bits."""
    workspace = SkinnyGemmWorkspace("cuda")
    seed = fresh_seed()
    for launch in range(3):
        check_skinny_linear("cuda", torch.bfloat16, 140, 1024, 3072, config, seed + launch, workspace)
    x, w = make_inputs("cuda", torch.bfloat16, 140, 1024, 3072, seed)
    first = skinny_linear(x, w, config, workspace)
    assert all(torch.equal(skinny_linear(x, w, config, workspace), first) for _ in range(5)), seed


@on_cuda
@pytest.mark.parametrize("config", [GemmConfig(16, 32, 128, 1), SPLIT], ids=GemmConfig.label)
def test_cuda_graph_replays_with_new_inputs(config):
    """Two layers share one workspace inside one graph, as a decode step's layers would."""
    m, n, k = 7, 1024, 2048
    workspace = SkinnyGemmWorkspace("cuda").reserve(m, n, config)
    x, w1 = make_inputs("cuda", torch.bfloat16, m, n, k, fresh_seed())
    w2 = make_inputs("cuda", torch.bfloat16, m, n, k, fresh_seed())[1]
    skinny_linear(x, w1, config, workspace)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1 = skinny_linear(x, w1, config, workspace)
        y2 = skinny_linear(x, w2, config, workspace)
    for _ in range(2):
        seed = fresh_seed()
        new_x, new_w1 = make_inputs("cuda", torch.bfloat16, m, n, k, seed)
        x.copy_(new_x)
        w1.copy_(new_w1)
        graph.replay()
        torch.cuda.synchronize()
        assert_rows_close(y1, x, w1, f"graph replay, layer 1, {config.label()}, seed {seed}")
        assert_rows_close(y2, x, w2, f"graph replay, layer 2, {config.label()}, seed {seed}")
        assert not workspace.counters.any(), f"counters left set after a replay ({config.label()})"


@on_cuda
@pytest.mark.parametrize("prefetch", [False, True], ids=["wait", "prefetch_then_wait"])
@pytest.mark.parametrize("config", [GemmConfig(16, 32, 128, 1), SPLIT], ids=GemmConfig.label)
def test_programmatic_dependent_launch_changes_no_bit_of_a_chain_in_a_graph(config, prefetch):
    """Each launch reads the one before's output: with PDL a kernel may be resident before its
    predecessor ends, and must still wait for its writes (experiments/kernels/pdl_chain.py)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs Hopper or later")
    m, k = 7, 1024
    workspace = SkinnyGemmWorkspace("cuda").reserve(m, k, config)
    x = make_inputs("cuda", torch.bfloat16, m, k, k, fresh_seed())[0]
    weights = [make_inputs("cuda", torch.bfloat16, m, k, k, fresh_seed())[1] / k ** 0.5 for _ in range(6)]

    def chain(pdl):
        h = x
        for w in weights:
            h = skinny_linear(h, w, config, workspace, pdl=pdl, prefetch=prefetch)
        return h

    expected = chain(False)
    chain(True)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(True)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"PDL chain differs from the plain one ({config.label()})"
    assert not workspace.counters.any()


# ---- CPU: argument checks, config and workspace rules -------------------------------------------


class _NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError(f"the kernel was launched (grid {grid}) where the arguments should have been refused")


@pytest.fixture
def no_launch(monkeypatch):
    monkeypatch.setattr(sk, "_skinny_gemm_kernel", _NoLaunch())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return monkeypatch


def test_rejects_bad_arguments_before_any_launch(no_launch):
    x, w, cfg = torch.randn(4, 64), torch.randn(32, 64), GemmConfig(16, 32, 64)
    small = SkinnyGemmWorkspace("cpu").reserve(4, 16, GemmConfig(16, 16, 128, 4))  # half the partials needed
    cases = [
        ((torch.randn(2, 4, 64), w, cfg), r"x must be \[M, K\] and weight \[N, K\]"),
        ((x, torch.randn(32, 65), cfg), "K=64 columns"),
        ((x, w.double(), cfg), "share a dtype"),
        ((x.int(), w.int(), cfg), "share a dtype"),
        ((torch.randn(64, 4).T, w, cfg), "contiguous"),
        ((x, torch.randn(64, 32).T, cfg), "contiguous"),
        ((x, w.to("meta"), cfg), "x is on cpu but weight on meta"),
        ((x, w, {"block_m": 16}), "must be a GemmConfig"),
        ((x, w, SPLIT), "split_k=4 needs a SkinnyGemmWorkspace"),
        ((x, w, SPLIT, small), "reserve"),
        ((x, w, SPLIT, SkinnyGemmWorkspace("meta").reserve(4, 32, SPLIT)), "workspace is on meta"),
        ((x, w, cfg), "CUDA device"),  # valid arguments, but no GPU and no interpreter
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            skinny_linear(*args)
        assert "\n" not in message


def test_empty_shapes_need_no_launch(no_launch):
    no_launch.setenv("TRITON_INTERPRET", "1")  # passes the device check; the kernel is still refused
    cfg = GemmConfig(16, 32, 64)
    assert skinny_linear(torch.randn(0, 64), torch.randn(32, 64), cfg).shape == (0, 32)
    y = skinny_linear(torch.randn(3, 0), torch.randn(5, 0), cfg)
    assert y.shape == (3, 5) and not y.any()  # an empty sum is zero


@pytest.mark.parametrize("fields, name", [
    ((8, 32, 64), "block_m"), ((16, 48, 64), "block_n"), ((16, 32, 0), "block_k"),
    ((16, 32, 64, 0), "split_k"), ((16, 32, 64, 1, 3), "num_warps"), ((16, 32, 64, 1, 4, 0), "num_stages"),
])
def test_config_names_a_bad_field(fields, name):
    with pytest.raises(ValueError, match=f"GemmConfig.{name} "):
        GemmConfig(*fields)


def test_workspace_is_sized_by_reserve_and_only_grows():
    cfg = GemmConfig(16, 32, 64, 4)
    assert SkinnyGemmWorkspace.sizes(40, 100, GemmConfig(16, 32, 64)) == (0, 0)
    # 3 row tiles x 4 column tiles, 4 splits of 16 x 32 partials each
    assert SkinnyGemmWorkspace.sizes(40, 100, cfg) == (12 * 4 * 16 * 32, 12)
    ws = SkinnyGemmWorkspace("cpu").reserve(40, 100, cfg)
    assert ws.partials.numel() == 12 * 4 * 16 * 32 and ws.counters.numel() == 12 and not ws.counters.any()
    ws.check(33, 97, cfg, torch.device("cpu"))  # smaller shapes fit
    with pytest.raises(ValueError, match="reserve"):
        ws.check(49, 100, cfg, torch.device("cpu"))
    partials = ws.partials
    assert ws.reserve(10, 10, cfg).partials is partials  # never shrinks or reallocates needlessly
    ws.reserve(140, 1024, GemmConfig(64, 64, 128, 8))
    assert ws.partials.numel() == 3 * 16 * 8 * 64 * 64 and ws.counters.numel() == 48 and not ws.counters.any()
    ws.counters[5] = 2  # as an interrupted launch would leave them
    ws.reset()
    assert not ws.counters.any()


@pytest.mark.parametrize("num_sms", [132, 114])
def test_default_config_gives_one_to_two_programs_per_sm(num_sms):
    for model in MODELS:
        for n, k in projections(model).values():
            for m in (1, 8, 32, 64, 140, 256, 512):
                cfg = sk.default_config(m, n, k, num_sms)
                what = f"{model} {n}x{k} m={m}: {cfg.label()}"
                m_tiles, n_tiles, splits = cfg.grid(m, n)
                programs = m_tiles * n_tiles * splits
                assert cfg.block_m == sk.rows_block(m), what
                assert programs >= 0.75 * num_sms, what
                if splits > 1:  # split only what the tiles alone could not fill, keeping two K steps each
                    assert programs < 1.5 * num_sms and m_tiles * n_tiles < 0.75 * num_sms, what
                    assert k >= 2 * splits * cfg.block_k, what
                if programs > 2 * num_sms:  # plenty of tiles: the widest tile, no split
                    assert cfg.block_n == 128 and splits == 1, what
                for element_size in (2, 4):
                    big = sk.default_config(m, n, k, num_sms, element_size)
                    assert big.shared_memory_bytes(element_size) <= 227 * 1024, what


def test_default_config_splits_k_only_when_tiles_are_few():
    o_proj = sk.default_config(1, 1024, 2048, 132)  # 0.6B o_proj: 32 column tiles of 32
    assert (o_proj.block_n, o_proj.split_k) == (32, 4)
    qkv = sk.default_config(1, 4096, 1024, 132)  # 128 narrow tiles: enough without a split
    assert (qkv.block_n, qkv.split_k) == (32, 1)
    gate_up = sk.default_config(1, 24576, 4096, 132)  # 8B gate/up: 192 wide tiles
    assert (gate_up.block_n, gate_up.split_k) == (128, 1)
    assert sk.default_config(1, 1024, 256, 132).split_k == 1  # K too short to share out


def test_probe_candidates_follow_the_batch_and_fit_in_shared_memory():
    for batch in BATCHES:
        for model in MODELS:
            for n, k in projections(model).values():
                tried = candidates(batch, n, k, 132, 227 * 1024)
                assert 12 <= len(tried) <= 20 and len(set(tried)) == len(tried), (batch, n, k)
                assert {c.block_m for c in tried} == {sk.rows_block(batch)}
                assert sk.default_config(batch, n, k, 132) in tried
    tight = candidates(256, 4096, 4096, 132, 100_000)
    assert tight and all(c.shared_memory_bytes(2) <= 100_000 for c in tight)
    assert len(tight) < len(candidates(256, 4096, 4096, 132, 227 * 1024))


# ---- CPU: the kernel under Triton's interpreter -------------------------------------------------


def test_kernel_under_the_triton_interpreter():
    seed = fresh_seed()
    code = ("from tests.kernels.skinny_gemm_cases import interpreter_checks; "
            f"print('launches', interpreter_checks({seed}))")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"seed {seed}\n" + run.stdout[-3000:] + run.stderr[-6000:]
    assert re.search(r"^launches 48$", run.stdout, re.M), run.stdout[-2000:]
