"""Tile configurations of the fused MoE kernel (kernels.fused_moe), per token count, from tuned tables.

A table is a JSON file kernels/configs/fused_moe_<E>_<N>_<dtype>_<device>.json (E experts, N the
per-rank intermediate width, the activation dtype's torch name, the device name with every run of
non-alphanumerics as one underscore, e.g. NVIDIA_H200), written by experiments/moe/tune_fused_moe.py:

    {"E": 128, "N": 768, "dtype": "bfloat16", "device": "NVIDIA_H200", "meta": {...},
     "configs": {"128": {"BLOCK_M": 16,
                         "gate_up": {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
                         "down": {...}}, ...}}

A call of T tokens takes the entry whose key is nearest T (the smaller on a tie); without a file
for its shape it takes the defaults below, and logs a warning once per missing file. The table is
the one of the GPU the call runs on (torch.cuda.get_device_name), so an H100 and an H200 each
read their own: fused_moe_128_768_bfloat16_NVIDIA_H100_80GB_HBM3.json, ..._NVIDIA_H200.json.
BLOCK_M is shared by both GEMMs because the alignment that groups pairs into one-expert tiles is
done once, for one tile height.

The only state is an lru_cache of parsed files and of lookups: a pure memo of committed files that
do not change while a process runs, so every call with the same shape gets the same config (which
also keeps a CUDA graph's captured kernels matching what eager calls would run). No triton import,
so the lookup is testable on CPU.

Each distinct launch variant (launch_variant: the tiles and the alignment's scan switch) is a
Triton compile of its own, 0.3-0.5 s the first time a step meets it; warmup_token_counts names one
token count per variant, which the engine runs at start-up (engine.moe_warmup).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from kernels.moe_align import CHUNK, scanned, tokens_per_program

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).parent / "configs"
ALLOWED = {"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (16, 32, 64, 128, 256), "BLOCK_K": (16, 32, 64, 128, 256),
           "num_warps": (1, 2, 4, 8, 16), "num_stages": (None, 1, 2, 3, 4, 5, 6, 7, 8)}
GEMMS = ("gate_up", "down")


@dataclass(frozen=True)
class GemmTiles:
    """One grouped GEMM's launch: tile width and depth, warps, pipeline stages (None: Triton's default)."""

    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int | None = None

    def to_json(self) -> dict:
        return {"BLOCK_N": self.block_n, "BLOCK_K": self.block_k, "num_warps": self.num_warps,
                "num_stages": self.num_stages}


@dataclass(frozen=True)
class MoeTiles:
    block_m: int
    gate_up: GemmTiles = GemmTiles()
    down: GemmTiles = GemmTiles()

    def to_json(self) -> dict:
        return {"BLOCK_M": self.block_m, "gate_up": self.gate_up.to_json(), "down": self.down.to_json()}


def block_m_for(num_pairs: int, num_experts: int) -> int:
    """Default tile height: small when few pairs land on each expert (decode), taller for prefill."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def default_tiles(num_pairs: int, num_experts: int) -> MoeTiles:
    return MoeTiles(block_m_for(num_pairs, num_experts))


def device_key(device_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3'."""
    return re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_")


def table_path(num_experts: int, inter: int, dtype: str, device_name: str, directory: Path = CONFIG_DIR) -> Path:
    return Path(directory) / f"fused_moe_{num_experts}_{inter}_{dtype}_{device_key(device_name)}.json"


def _field(where: str, entry: dict, name: str) -> int | None:
    if name not in entry and name != "num_stages":
        raise ValueError(f"{where}: missing {name} (allowed values {ALLOWED[name]})")
    value = entry.get(name)
    if value not in ALLOWED[name] or isinstance(value, bool):
        raise ValueError(f"{where}: {name}={value!r} is not one of {ALLOWED[name]}")
    return value


def _gemm(where: str, entry: object) -> GemmTiles:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object with BLOCK_N, BLOCK_K, num_warps, num_stages")
    extra = set(entry) - {"BLOCK_N", "BLOCK_K", "num_warps", "num_stages"}
    if extra:
        raise ValueError(f"{where}: unknown keys {sorted(extra)}")
    n, k, w = (_field(where, entry, f) for f in ("BLOCK_N", "BLOCK_K", "num_warps"))
    return GemmTiles(int(n or 0), int(k or 0), int(w or 0), _field(where, entry, "num_stages"))


def parse_table(data: object, source: str) -> tuple[tuple[int, MoeTiles], ...]:
    """The (token count, tiles) entries of a table, sorted by token count; ValueError naming the bad field."""
    configs = data.get("configs") if isinstance(data, dict) else None
    if not isinstance(configs, dict) or not configs:
        raise ValueError(f"{source}: 'configs' must be a non-empty object keyed by token count")
    entries = []
    for key, entry in configs.items():
        where = f"{source}: configs[{key!r}]"
        if not str(key).isdigit() or int(key) < 1:
            raise ValueError(f"{where}: the key must be a positive token count")
        if not isinstance(entry, dict) or set(entry) != {"BLOCK_M", *GEMMS}:
            raise ValueError(f"{where}: expected exactly the keys BLOCK_M, gate_up, down")
        block_m = int(_field(where, entry, "BLOCK_M") or 0)
        entries.append((int(key), MoeTiles(block_m, *(_gemm(f"{where}.{g}", entry[g]) for g in GEMMS))))
    return tuple(sorted(entries))


@functools.cache
def load_table(path: str) -> tuple[tuple[int, MoeTiles], ...] | None:
    """A table file's entries (read once per path), or None when there is no such file (said once
    per path: that shape runs on the default tiles)."""
    file = Path(path)
    if not file.is_file():
        log.warning("no tuned fused-MoE tiles %s: default tiles (write the table with "
                    "experiments/moe/tune_fused_moe.py on this GPU)", file.name)
        return None
    return parse_table(json.loads(file.read_text()), str(file))


def nearest(entries: tuple[tuple[int, MoeTiles], ...], num_tokens: int) -> MoeTiles:
    return min(entries, key=lambda e: (abs(e[0] - num_tokens), e[0]))[1]


@functools.lru_cache(maxsize=4096)
def tiles_for(num_tokens: int, top_k: int, num_experts: int, inter: int, dtype: str, device_name: str,
              directory: str = str(CONFIG_DIR)) -> MoeTiles:
    """The tiles a call of num_tokens tokens runs with: the table's nearest entry, else the defaults."""
    entries = load_table(str(table_path(num_experts, inter, dtype, device_name, Path(directory))))
    if entries is None:
        return default_tiles(num_tokens * top_k, num_experts)
    return nearest(entries, num_tokens)


def launch_variant(num_tokens: int, top_k: int, num_experts: int, inter: int, dtype: str, device_name: str,
                   align_experts: int | None = None, directory: str = str(CONFIG_DIR)) -> tuple[MoeTiles, bool, bool]:
    """What a fused-MoE call of num_tokens tokens compiles for: its tiles, and whether the alignment
    scans on the routed path (kernels.moe_route) and on the path from given ids (expert
    parallelism: align_experts, this rank's experts plus one for the others'; default num_experts).
    Every other kernel argument that follows the token count is left unspecialised."""
    tiles = tiles_for(num_tokens, top_k, num_experts, inter, dtype, device_name, directory)
    pairs = num_tokens * top_k
    routed = scanned(pairs, num_experts, tiles.block_m, tokens_per_program(top_k) * top_k)
    by_ids = scanned(pairs, align_experts or num_experts, tiles.block_m, CHUNK)
    return tiles, routed, by_ids


def warmup_token_counts(max_tokens: int, top_k: int, num_experts: int, inter: int, dtype: str, device_name: str,
                        align_experts: int | None = None, directory: str = str(CONFIG_DIR)) -> tuple[int, ...]:
    """The smallest token count of each launch variant a call of 1..max_tokens tokens can take,
    ascending: running each once compiles every variant a step can meet."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    first: dict[tuple[MoeTiles, bool, bool], int] = {}
    for t in range(1, max_tokens + 1):
        first.setdefault(launch_variant(t, top_k, num_experts, inter, dtype, device_name, align_experts,
                                        directory), t)
    return tuple(sorted(first.values()))


def write_table(path: Path, num_experts: int, inter: int, dtype: str, device_name: str,
                best: dict[int, MoeTiles], meta: dict) -> None:
    data = {"E": num_experts, "N": inter, "dtype": dtype, "device": device_key(device_name), "meta": meta,
            "configs": {str(t): tiles.to_json() for t, tiles in sorted(best.items())}}
    parse_table(data, str(path))  # never write a table the lookup would refuse
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
