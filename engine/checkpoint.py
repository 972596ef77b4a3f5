"""Write a Hugging Face-format checkpoint with random weights, for tests and benchmarks.

    python -m engine.checkpoint --preset tiny-qwen3 --out /tmp/tiny-qwen3
    python -m engine.checkpoint --preset qwen3-8b --out /data/qwen3-8b --dtype bfloat16

Weights are streamed: each tensor is generated (in row chunks), written and dropped, so an 8B
bf16 checkpoint needs far less RAM than its size. Each tensor has its own generator seeded from
(seed, tensor name), so the bytes depend only on the preset, seed and dtype.

A write is all or nothing: the files go into a hidden sibling folder, which is renamed into place
once complete, so an interrupted write never leaves a folder that looks like a checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import torch

from engine.core.model_shapes import ModelShape
from engine.models.presets import PRESETS, hf_tensor_shapes, preset_config
from engine.tokenizer_builder import ENDOFTEXT, IM_END, build_tokenizer, save_tokenizer, special_token_ids

_DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "float32": (torch.float32, "F32"),
    "bfloat16": (torch.bfloat16, "BF16"),
    "float16": (torch.float16, "F16"),
}
DEFAULT_MAX_SHARD_BYTES = 4 * 1024**3
_CHUNK_ELEMENTS = 1 << 24  # generate at most this many values at once (64 MiB of float32)
_INIT_STD = 0.02


def write_checkpoint(
    preset: str,
    out_dir: str | Path,
    seed: int = 0,
    dtype: str | torch.dtype | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Write config.json, generation_config.json, the tokenizer and safetensors weights.

    dtype: "float32" | "bfloat16" | "float16" (or the torch dtype); None keeps the preset's.
    out_dir appears only once complete. It may be missing, empty or an earlier checkpoint (one
    with a config.json), which is replaced as a whole, so a folder never mixes two writes; any
    other folder is refused rather than overwritten.
    """
    config = preset_config(preset)
    dtype_name = _dtype_name(dtype if dtype is not None else config["torch_dtype"])
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} must be > 0")
    out = Path(out_dir).absolute()
    replaceable = out.is_dir() and (not any(out.iterdir()) or (out / "config.json").is_file())
    if out.exists() and not replaceable:
        raise ValueError(f"out_dir={str(out)!r} is neither an empty folder nor a checkpoint (no config.json); "
                         "pass a new or empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(out)
    # named after this process, so a later write can tell an abandoned folder from a live one
    partial = out.parent / f"{_partial_prefix(out)}{os.getpid()}-{secrets.token_hex(4)}"
    partial.mkdir()
    try:
        _write_files(partial, config, dtype_name, seed, max_shard_bytes)
        _move_into_place(partial, out)
    except BaseException:  # Ctrl-C too: nothing half-written is left behind
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return Path(out_dir)


def _partial_prefix(out: Path) -> str:
    return f".{out.name}.partial-"


def _remove_abandoned(out: Path) -> None:
    """Delete the partial folders of earlier writes to out whose process is gone (killed before
    it could clean up); a live writer's folder is left alone."""
    for folder in out.parent.glob(f"{_partial_prefix(out)}*"):
        pid = folder.name.removeprefix(_partial_prefix(out)).split("-", 1)[0]
        if not pid.isdigit() or not _process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _move_into_place(partial: Path, out: Path) -> None:
    # A rename within one folder is atomic, and replaces an empty folder; a checkpoint already
    # there is first renamed aside (the one moment out is missing), then deleted.
    if not out.exists() or not any(out.iterdir()):
        partial.replace(out)
        return
    old = partial.with_name(partial.name + "-old")
    out.rename(old)
    partial.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def write_model_files(out: Path, config: dict[str, Any], dtype_name: str) -> None:
    """Everything of a checkpoint but its weights: config.json, generation_config.json, the tokenizer
    (also what load_format=dummy serves a preset from, engine.dummy)."""
    tokenizer = build_tokenizer()
    ids = special_token_ids(tokenizer)
    config.update(torch_dtype=dtype_name, bos_token_id=ids[ENDOFTEXT], eos_token_id=ids[IM_END])
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": ids[ENDOFTEXT], "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]], "pad_token_id": ids[ENDOFTEXT]},
    )
    save_tokenizer(tokenizer, out, model_max_length=config["max_position_embeddings"])


def _write_files(out: Path, config: dict[str, Any], dtype_name: str, seed: int, max_shard_bytes: int) -> None:
    write_model_files(out, config, dtype_name)
    specs = hf_tensor_shapes(ModelShape.from_hf_config(config))
    torch_dtype, _ = _DTYPES[dtype_name]
    elem = torch_dtype.itemsize
    shards = _plan_shards(specs, elem, max_shard_bytes)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(out / fname, shard, dtype_name, seed)
        weight_map.update({name: fname for name, _ in shard})
    if len(shards) > 1:
        total = sum(_numel(shape) for _, shape in specs) * elem
        _write_json(
            out / "model.safetensors.index.json",
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
        )


def is_complete(folder: str | Path) -> bool:
    """Whether folder holds a config.json and every weight file it should, each as long as its
    header says (only the headers are read). False for a checkpoint cut short by an interrupted
    write of this project's earlier writer, which wrote in place."""
    root = Path(folder)
    index = root / "model.safetensors.index.json"
    try:
        names = set(json.loads(index.read_text())["weight_map"].values()) if index.is_file() else {"model.safetensors"}
        return (root / "config.json").is_file() and all(_full_length(root / name) for name in names)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _full_length(path: Path) -> bool:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    return path.stat().st_size == 8 + length + end


def _dtype_name(dtype: str | torch.dtype) -> str:
    for name, (td, _) in _DTYPES.items():
        if dtype == name or dtype == td:
            return name
    raise ValueError(f"dtype={dtype!r} is not supported; expected one of {sorted(_DTYPES)}")


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _plan_shards(specs, elem: int, max_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    # Greedy in layer order; a tensor larger than max_bytes gets a shard of its own.
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for name, shape in specs:
        size = _numel(shape) * elem
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append((name, shape))
        used += size
    return shards


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def _write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]], dtype_name: str, seed: int) -> None:
    """The safetensors layout written by hand: u64 header length, JSON header, raw bytes."""
    torch_dtype, st_dtype = _DTYPES[dtype_name]
    elem = torch_dtype.itemsize
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        size = _numel(shape) * elem
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape in tensors:
            if _is_norm(name):
                f.write(torch.ones(shape, dtype=torch_dtype).view(torch.uint8).numpy().tobytes())
                continue
            gen = torch.Generator().manual_seed(_tensor_seed(seed, name))
            row = _numel(shape[1:])
            rows_per_chunk = max(1, _CHUNK_ELEMENTS // row)
            for start in range(0, shape[0], rows_per_chunk):
                rows = min(rows_per_chunk, shape[0] - start)
                chunk = torch.randn((rows, *shape[1:]), generator=gen) * _INIT_STD
                f.write(chunk.to(torch_dtype).view(torch.uint8).numpy().tobytes())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine.checkpoint", description="Write a random-weight Hugging Face checkpoint."
    )
    parser.add_argument("--preset", required=True, metavar="{" + ",".join(PRESETS) + "}")
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="default: the preset's")
    parser.add_argument("--max-shard-gb", type=float, default=DEFAULT_MAX_SHARD_BYTES / 1024**3)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        out = write_checkpoint(args.preset, args.out, args.seed, args.dtype, int(args.max_shard_gb * 1024**3))
    except ValueError as error:
        parser.error(str(error))  # one line: the preset's spelling or the known ones, or a bad --out
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(f"wrote {args.preset} to {out}: {size / 1e9:.3f} GB of weights in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
