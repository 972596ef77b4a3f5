"""kernels.moe_configs (the tuned-tile lookup) and kernels.moe_align (the torch alignment) on CPU."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.moe_align import align_capacity, moe_align
from kernels.moe_configs import (
    CONFIG_DIR,
    GemmTiles,
    MoeTiles,
    block_m_for,
    device_key,
    load_table,
    parse_table,
    table_path,
    tiles_for,
    write_table,
)

TUNED = {1: MoeTiles(16, GemmTiles(32, 128, 4, 4), GemmTiles(64, 256, 8, 2)),
         128: MoeTiles(16, GemmTiles(128, 64, 8, 5), GemmTiles(32, 64, 4, None)),
         1024: MoeTiles(64, GemmTiles(128, 128, 8, 3), GemmTiles(128, 64, 4, 3))}


def _write(tmp_path, best=TUNED):
    path = table_path(128, 768, "bfloat16", "NVIDIA H200", tmp_path)
    write_table(path, 128, 768, "bfloat16", "NVIDIA H200", best, {"command": "test"})
    return path


def test_device_names_become_file_names():
    assert device_key("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert table_path(128, 768, "bfloat16", "NVIDIA H200").name == "fused_moe_128_768_bfloat16_NVIDIA_H200.json"


def test_without_a_table_the_defaults_serve_and_say_so_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="kernels.moe_configs"):
        got = tiles_for(140, 8, 128, 768, "bfloat16", "No Such GPU", str(tmp_path))
        tiles_for(7, 8, 128, 768, "bfloat16", "No Such GPU", str(tmp_path))
    assert got == MoeTiles(block_m_for(140 * 8, 128)) and got.gate_up == GemmTiles(64, 64, 4, None)
    said = [r.getMessage() for r in caplog.records if "default tiles" in r.getMessage()]
    assert len(said) == 1 and "fused_moe_128_768_bfloat16_No_Such_GPU.json" in said[0]


def test_each_gpu_reads_its_own_table(tmp_path):
    """An H100 and an H200 in one tree: the call's device name picks the file."""
    h100 = {1: MoeTiles(16, GemmTiles(32, 256, 4, 2)), 4096: MoeTiles(128, GemmTiles(128, 64, 8, 3))}
    _write(tmp_path)
    write_table(table_path(128, 768, "bfloat16", "NVIDIA H100 80GB HBM3", tmp_path), 128, 768, "bfloat16",
                "NVIDIA H100 80GB HBM3", h100, {"command": "test"})
    assert tiles_for(3000, 8, 128, 768, "bfloat16", "NVIDIA H100 80GB HBM3", str(tmp_path)) == h100[4096]
    assert tiles_for(3000, 8, 128, 768, "bfloat16", "NVIDIA H200", str(tmp_path)) == TUNED[1024]


@pytest.mark.parametrize("tokens, key", [(1, 1), (2, 1), (64, 1), (65, 128), (140, 128), (575, 128), (576, 128),
                                         (577, 1024), (9999, 1024)])
def test_the_nearest_token_count_is_taken_smaller_on_ties(tmp_path, tokens, key):
    _write(tmp_path)
    assert tiles_for(tokens, 8, 128, 768, "bfloat16", "NVIDIA H200", str(tmp_path)) == TUNED[key]


def test_a_table_round_trips_and_is_read_once(tmp_path, monkeypatch):
    path = _write(tmp_path)
    assert dict(load_table(str(path))) == TUNED
    path.write_text("not json")  # a cached file is not read again
    assert dict(load_table(str(path))) == TUNED
    load_table.cache_clear()
    with pytest.raises(json.JSONDecodeError):
        load_table(str(path))
    load_table.cache_clear()


@pytest.mark.parametrize("change, field", [
    (lambda c: c["1"].update(BLOCK_M=48), "BLOCK_M=48"),
    (lambda c: c["1"]["gate_up"].update(num_warps=3), "num_warps=3"),
    (lambda c: c["1"]["down"].pop("BLOCK_K"), "missing BLOCK_K"),
    (lambda c: c["1"]["down"].update(extra=1), "unknown keys"),
    (lambda c: c.update({"0": c["1"]}), "positive token count"),
    (lambda c: c["1"].pop("down"), "BLOCK_M, gate_up, down"),
])
def test_bad_tables_name_the_field(tmp_path, change, field):
    data = json.loads(_write(tmp_path).read_text())
    change(data["configs"])
    with pytest.raises(ValueError, match=field):
        parse_table(data, "t.json")


def test_committed_tables_parse():
    for path in CONFIG_DIR.glob("fused_moe_*.json"):
        data = json.loads(path.read_text())
        assert path == table_path(data["E"], data["N"], data["dtype"], data["device"])
        assert parse_table(data, str(path))


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(0, 60), experts=st.integers(1, 40), top_k=st.integers(1, 4),
       block_m=st.sampled_from([1, 4, 16]), seed=st.integers(0, 2**31 - 1))
def test_torch_alignment_places_every_pair_once_in_one_expert_tiles(tokens, experts, top_k, block_m, seed):
    top_k = min(top_k, experts)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices
    sorted_ids, tile_expert, num_padded = moe_align(ids, experts, block_m)
    n, padded = tokens * top_k, int(num_padded)
    assert sorted_ids.numel() == align_capacity(n, experts, block_m) == tile_expert.numel() * block_m
    counts = torch.bincount(ids.reshape(-1), minlength=experts)
    assert padded == int(((counts + block_m - 1) // block_m * block_m).sum()) and padded % block_m == 0
    assert bool((sorted_ids[padded:] == n).all())
    real = sorted_ids[sorted_ids < n].long()
    assert sorted(real.tolist()) == list(range(n))
    assert bool((real.diff() > 0).all()) if real.numel() > 1 and experts == 1 else True
    flat = ids.reshape(-1)
    for tile in range(padded // block_m):
        members = sorted_ids[tile * block_m:(tile + 1) * block_m].long()
        members = members[members < n]
        assert members.numel() > 0 and bool((flat[members] == tile_expert[tile]).all())
        assert bool((members.diff() > 0).all())  # an expert's pairs keep their order
