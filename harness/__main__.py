"""`python -m harness [overrides]`: the Hydra entry point (config groups in conf/ at the repo root).

Examples:
  python -m harness                                    # nano-vllm's bench, Qwen3-0.6B on a simulated H100
  python -m harness experiment=preemption
  python -m harness model=qwen3-8b scheduler=mixed workload=trace_azure_conv scheduler.max_num_seqs=128
  python -m harness -m scheduler=nano,mixed hydra/launcher=joblib    # multirun, then python -m harness.report
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from engine.worker_loop import WorkerError
from harness.config import CONF_DIR, moved_override
from harness.convert import ConfigError
from harness.workloads import TraceError


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    from harness.study import run_study

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_study(cfg, out_dir)
    except (ConfigError, TraceError) as error:
        # A user mistake: one line naming the field, not a traceback.
        remove_if_unused(out_dir)
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except WorkerError as error:
        # An engine process failed (its traceback is error.details): one line, as above.
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None


def remove_if_unused(out_dir: Path) -> None:
    """Delete a run folder that holds only what Hydra wrote before the run (.hydra/, the job log),
    and the parents it leaves empty, up to the working directory."""
    if not out_dir.is_dir() or any(p.name != ".hydra" and p.suffix != ".log" for p in out_dir.iterdir()):
        return
    shutil.rmtree(out_dir)
    cwd = Path.cwd().resolve()
    parent = out_dir.resolve().parent
    while parent != cwd and cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


if __name__ == "__main__":
    if (moved := moved_override(sys.argv[1:])) is not None:
        print(f"error: {moved}", file=sys.stderr)
        raise SystemExit(2)
    main()
