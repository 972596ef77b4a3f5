"""`python -m harness [overrides]`: the Hydra entry point (config groups in conf/ at the repo root).

Examples:
  python -m harness                                    # nano-vllm's bench, Qwen3-0.6B on a simulated H100
  python -m harness experiment=preemption
  python -m harness model=qwen3-8b scheduler=mixed workload=trace_azure_conv scheduler.max_num_seqs=128
  python -m harness -m scheduler=nano,mixed hydra/launcher=joblib    # multirun, then python -m harness.report

Every way it can end badly ends with one line on stderr: a config mistake (exit 2, checked before
Hydra composes anything where Hydra would print its search path), a failed engine process (1),
Ctrl-C (130) or SIGTERM (143), after which the run folder is complete and marked INTERRUPTED, or
gone (harness.run_folder); harness.interrupts says what counts as an interrupt.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from engine.worker_loop import WorkerError
from harness.arguments import check_arguments, group_options, run_groups
from harness.convert import ConfigError
from harness.interrupts import Interrupts, exit_for, installed, interrupt_in, signal_of
from harness.paths import CONF_DIR
from harness.run_folder import UniqueDirs, finish_interrupted, remove_if_unused
from harness.workloads import TraceError


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    from harness.study import run_study

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_study(cfg, out_dir)
        if (interrupts := installed()) is not None:
            interrupts.raise_swallowed()
    except KeyboardInterrupt as interrupt:
        _stop_run(interrupt, cfg, out_dir)
    except Exception as error:
        if (wrapped := interrupt_in(error)) is not None:  # an interrupt CPython or a library wrapped
            _stop_run(wrapped, cfg, out_dir)
        if isinstance(error, (ConfigError, TraceError)):
            # A user mistake: one line naming the field, not a traceback.
            remove_if_unused(out_dir)
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        if isinstance(error, WorkerError):
            # An engine process failed (its traceback is error.details): one line, as above.
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(1) from None
        raise


def _stop_run(interrupt: KeyboardInterrupt, cfg: DictConfig, out_dir: Path) -> NoReturn:
    """The run folder complete or gone, one line, exit 128 + signum."""
    name = signal_of(interrupt)[1]
    print(f"interrupted ({name}): {finish_interrupted(out_dir, name, _planned_runs(cfg))}", file=sys.stderr)
    raise exit_for(interrupt) from None


def _planned_runs(cfg: DictConfig) -> int | None:
    """How many runs the study meant to write (a sweep's points), None when that is not a count."""
    study = cfg.get("study") or {}
    return len(study.get("values") or []) if study.get("kind") == "sweep" else None


HELP_FLAGS = ("-h", "--help")


def usage() -> str:
    """`--help`: the examples above and the options the command line takes. Hydra's own help would
    list every file of conf/, the refused spellings of model names and python -m harness.serve's group among them."""
    groups = "\n".join(f"  {group}: {', '.join(group_options(group))}" for group in sorted(run_groups()))
    return (f"{(__doc__ or '').strip()}\n\nConfig groups (group=option; docs/running.md):\n{groups}\n\n"
            "Every setting and its value: python -m harness --cfg job [overrides]. Hydra's flags: --hydra-help")


def cli(argv: list[str]) -> None:
    """Check the command line, then hand it to Hydra; SIGTERM ends the run as Ctrl-C does."""
    if any(flag in argv for flag in HELP_FLAGS):
        print(usage())
        return
    if (problem := check_arguments(argv)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    Interrupts().install()
    # conf/config.yaml's hydra.run.dir claims its folder through this resolver (never another run's)
    folders = UniqueDirs()
    OmegaConf.register_new_resolver("unique_dir", folders, replace=True)
    try:
        main()
    except (KeyboardInterrupt, Exception) as error:  # before or between runs: no run folder is open
        if (interrupt := interrupt_in(error)) is None:
            raise
        for folder in folders.claimed:  # claimed, but the run never started in it
            remove_if_unused(folder)
        print(f"interrupted ({signal_of(interrupt)[1]}) before a run folder was written", file=sys.stderr)
        raise exit_for(interrupt) from None


if __name__ == "__main__":
    cli(sys.argv[1:])
