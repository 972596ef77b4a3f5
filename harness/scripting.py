"""What the experiments/ scripts share: composing a run from Hydra overrides, reading recorded
step tables, stopping cleanly when a result folder's raw tables are not in the tree, and the
engine set-up of the GPU probes. Hydra and OmegaConf are imported only where a config is composed,
so a probe given --ckpt runs without them.

    python -m harness.scripting checkpoint qwen3-0.6b   # prints the random-weight checkpoint folder
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from harness.output.metrics import LEGACY_STEPS_FILE, STEPS_FILE, steps_path

if TYPE_CHECKING:
    from harness.config import RunConfig

# Runs 1-5 and every raw per-step / per-request table left the tree after this commit
# (experiments/README.md, "The rule for results").
RAW_TABLES_COMMIT = "e869d52"
STEPS_TABLES = (STEPS_FILE, LEGACY_STEPS_FILE)


def one_line_errors(main: Callable[[], int]) -> int:
    """main(), with a user mistake (a bad override or field, a missing trace) printed as one line, exit 2."""
    from hydra.errors import HydraException

    from harness.convert import ConfigError
    from harness.workloads import TraceError

    try:
        return main()
    except (ConfigError, TraceError, HydraException) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2


def compose_config(overrides: Sequence[str]):
    """The harness's composed config (conf/config.yaml plus overrides), as `python -m harness` sees it."""
    from hydra import compose, initialize_config_dir

    from harness.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def compose_run_config(overrides: Sequence[str]) -> RunConfig:
    from harness.config import build_run_config

    return build_run_config(compose_config(overrides))


class MissingInputs(SystemExit):
    """A script's recorded inputs are absent: exits with one line that says where to find them."""

    def __init__(self, what: str) -> None:
        super().__init__(f"error: {what} is missing; a committed run's raw tables and runs 1-5 are in git history: "
                         f"`git checkout {RAW_TABLES_COMMIT} -- <run folder>`")


def require(path: Path) -> Path:
    if not Path(path).exists():
        raise MissingInputs(str(path))
    return Path(path)


def steps_table_path(folder: Path) -> Path:
    """A run folder's steps table, written compressed or not; MissingInputs when neither is there."""
    try:
        return steps_path(folder)
    except FileNotFoundError:
        raise MissingInputs(f"{Path(folder)}/{' or '.join(STEPS_TABLES)}") from None


def read_steps(path: Path) -> pd.DataFrame:
    """A steps table from a run folder or a named steps file (either compression)."""
    path = Path(path)
    if path.is_dir():
        return pd.read_csv(steps_table_path(path))
    if not path.is_file() and path.name in STEPS_TABLES:
        return pd.read_csv(steps_table_path(path.parent))
    return pd.read_csv(require(path))


def model_checkpoint(model: str) -> str:
    """The random-weight checkpoint folder of conf/model/<model> (harness.checkpoints), written on first use."""
    from harness.checkpoints import ensure_checkpoint

    rc = compose_run_config([f"model={model}", "backend=engine"])
    ensure_checkpoint(rc.engine.model, rc.model)
    return rc.engine.model


def probe_parser(description: str, num_blocks: int | None = None, needs_checkpoint: bool = True
                 ) -> argparse.ArgumentParser:
    """--ckpt (or --model, a conf/model name whose random-weight checkpoint is used) and --out."""
    parser = argparse.ArgumentParser(description=description)
    source = parser.add_mutually_exclusive_group(required=needs_checkpoint)
    source.add_argument("--ckpt", help="checkpoint folder")
    source.add_argument("--model", help="conf/model name: its random-weight checkpoint (written on first use)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--max-model-len", type=int, default=4096, help="the engine's max_model_len")
    if num_blocks is not None:
        parser.add_argument("--num-blocks", type=int, default=num_blocks, help="KV cache blocks (pinned)")
    return parser


def probe_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed probe arguments, with ckpt resolved from --model and the output folder created."""
    args = parser.parse_args(argv)
    if args.ckpt is None and args.model is not None:
        args.ckpt = model_checkpoint(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def open_probe_engine(ckpt: str, num_blocks: int, max_num_seqs: int = 256, max_model_len: int = 4096,
                      block_size: int = 256, **engine_fields):
    """An engine executor with a pinned cache for timing hand-built steps, and its scheduler limits."""
    from engine.config import EngineConfig
    from engine.core.config import CacheConfig, SchedulerConfig
    from engine.executor import EngineExecutor

    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=16384, max_model_len=max_model_len)
    executor = EngineExecutor(EngineConfig(model=ckpt, **engine_fields), sched,
                              CacheConfig(block_size=block_size, num_blocks=num_blocks))
    return executor, sched


def probe_plan(executor, sched, entries, seed: int = 0):
    """A step of the given (new tokens, cached tokens, is_decode) entries (harness.calibration.profiling.build_plan)."""
    import numpy as np

    from harness.calibration.profiling import build_plan

    info = executor.info()
    return build_plan(entries, info.kv_cache_spec, sched, np.random.default_rng(seed), info.vocab_size)


def probe_grid():
    """Repeats for probe timings: more than the calibration grid's, as each probe times few shapes."""
    from harness.calibration.profiling import ProfileGrid

    return ProfileGrid(warmup=2, repeats=12, min_repeats=12, max_seconds_per_shape=5.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="helpers for experiments/ scripts")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("checkpoint", help="print (and write on first use) a conf/model's random-weight checkpoint"
                   ).add_argument("model")
    args = parser.parse_args(argv)

    def checkpoint() -> int:
        print(model_checkpoint(args.model))
        return 0

    return one_line_errors(checkpoint)


if __name__ == "__main__":
    sys.exit(main())
