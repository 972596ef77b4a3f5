"""The weight read alone: engine.loader.load_weights into one model allocated once, each read mode
in turn (engine.weight_reader: "mapped", tensor by tensor from the memory map, the calibrations'
read; "streamed", batches through pinned buffers, the default onto a GPU since this bench measured
it on an H100: experiments/autoscale/h100_8b/), from the page cache and, with --drop, from disk.
One CSV row per read; GB/s is the checkpoint's bytes over the read.

  python -m experiments.autoscale.load_bench --ckpt /tmp/ck/qwen3-8b --out $OUT/load_bench.csv --drop  # on a GPU
  python -m experiments.autoscale.load_bench --ckpt /tmp/tiny --out /tmp/load_bench.csv --device cpu   # CPU check
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from experiments.autoscale import page_cache


def bench(ckpt: Path, device: str, repeats: int, drop: bool, out: Path) -> list[dict]:
    import pandas as pd
    import torch
    from transformers import AutoConfig

    from engine import loader
    from engine.attention.registry import get_attention_backend
    from engine.models import build_model

    dev = torch.device(device)
    config = AutoConfig.from_pretrained(ckpt)
    dtype = loader.resolve_dtype(config.to_dict(), "auto" if dev.type == "cuda" else "float32", ckpt / "config.json")
    model = build_model(config, get_attention_backend("torch", dev), dtype=dtype, device=dev)
    size = page_cache.weight_bytes(ckpt)
    modes = ["mapped", "streamed"] if dev.type == "cuda" else ["mapped"]
    sources = ["page cache"] + (["disk"] if drop else [])
    rows: list[dict] = []
    for repeat in range(repeats):
        for source in sources:
            for mode in modes:
                if source == "disk":
                    page_cache.drop(ckpt)
                else:  # one read first so that the page cache holds the files
                    for path in page_cache.weight_files(ckpt):
                        path.read_bytes()
                started = time.perf_counter()
                loader.load_weights(model, ckpt, mode)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                seconds = time.perf_counter() - started
                rows.append({"device": device, "mode": mode, "source": source, "repeat": repeat,
                             "weight_bytes": size, "seconds": seconds, "gb_per_s": size / seconds / 1e9})
                print(f"[load bench] {mode:8s} from {source:10s}: {seconds:.2f} s ({size / seconds / 1e9:.2f} "
                      "GB/s)", flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                pd.DataFrame(rows).to_csv(out, index=False)  # kept if a later read is cut short
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ckpt", type=Path, required=True, help="a checkpoint folder (engine.checkpoint writes one)")
    p.add_argument("--out", type=Path, required=True, help="the CSV")
    p.add_argument("--device", default="cuda", help="cuda (both modes) or cpu (mapped)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--drop", action="store_true", help="also read from disk (the files dropped from the page cache)")
    args = p.parse_args(argv)
    if not (args.ckpt / "config.json").is_file():
        raise SystemExit(f"error: --ckpt {args.ckpt} holds no checkpoint (config.json)")
    if args.device not in ("cuda", "cpu") or args.repeats < 1:
        raise SystemExit(f"error: --device must be cuda or cpu and --repeats >= 1 (got {args.device!r}, "
                         f"{args.repeats})")
    bench(args.ckpt, args.device, args.repeats, args.drop, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
