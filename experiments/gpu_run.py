"""One GPU device call of any study: named steps, each bounded in time, results under --out.

    python3 experiments/gpu_run.py --out $OUT [options] STEP [STEP ...]

Steps run in the order given; each writes its output to <out>/<step>.log and prints the end of it:
  wheels     install the carried Hydra wheels (.whl/*.whl, ../shared/wheels) and the serve extra's
             (.whl/serve/*.whl, when there) into /tmp/site; the steps after it import them
  env        device, driver, CPU and library versions -> env.txt
  pytest     python -m pytest -m gpu (--tests: files or folders; default the whole suite)
  bench      experiments/engine/bench_engine.py for --model's checkpoint, --variants -> bench/
  calibrate  experiments/calibration/calibrate_and_compare.py for --model on --workloads -> <model>/
  compare    python -m harness experiment=compare for --model on each of --workloads, priced by
             --profile, --repeats times -> compare_<workload>[_r<i>]/
  probe      each of --probes (experiments/ scripts that take --model and --out, run with -m)
             -> probe_<name>/
  bundle     everything under --out in one bundle.tar.gz (a device call returns a limited number
             of files)

A workload is a calibration stage (bench, poisson, azure: its overrides come from --calibration's
meta.json for compare, from calibrate_and_compare.py's STAGES for calibrate) or any conf/workload
name. --set adds Hydra overrides to every calibrate and compare run (calibrate also takes its
STAGE:, grid. and calibrate. forms). --dry-run prints the commands instead of running them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SITE = "/tmp/site"
SERVE_WHEELS = ".whl/serve"  # fastapi, uvicorn and their dependencies for Python 3.12 (experiments/README.md)
STEPS = ("wheels", "env", "pytest", "bench", "calibrate", "compare", "probe", "bundle")
CALIBRATION_STAGES = ("bench", "poisson", "azure")
ENV_COMMANDS = ["date -u", "nvidia-smi", "lscpu | head -20", "nproc",
                'python3 -c "import torch, triton; print(torch.__version__, triton.__version__, '
                'torch.cuda.get_device_name())"']


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("steps", nargs="+", choices=STEPS, metavar="STEP", help=f"one of {', '.join(STEPS)}")
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="results folder (default $OUT)")
    parser.add_argument("--model", default="qwen3-0.6b", help="conf/model name")
    parser.add_argument("--workloads", nargs="+", default=list(CALIBRATION_STAGES))
    parser.add_argument("--variants", default="default", help="bench_engine.py variants, comma-separated")
    parser.add_argument("--bench-args", default="", help="more bench_engine.py arguments, e.g. '--no-profile'")
    parser.add_argument("--tests", nargs="*", default=[], help="pytest paths (default: every gpu test)")
    parser.add_argument("--probes", nargs="*", default=[],
                        help="experiments/ scripts, e.g. prefill_graphs/step_probe.py")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="calibration run whose meta.json gives compare's stage overrides "
                             "(default experiments/calibration/h100_run6/<model, _ for - and .>)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="profiled model for compare (default the shipped profiles/h100/<model>.csv)")
    parser.add_argument("--repeats", type=int, default=1, help="compare: runs of each workload, fresh process each")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="Hydra overrides for calibrate/compare")
    parser.add_argument("--limit-s", type=float, default=540.0, help="the whole call: no step runs past it")
    parser.add_argument("--step-limit-s", type=float, default=None, help="one step at most (default: --limit-s)")
    parser.add_argument("--git-commit", default="unknown", help="recorded by calibrate")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("--out is required (or set OUT)")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    args.out = args.out.resolve()
    if args.calibration is None:
        folder = args.model.replace("-", "_").replace(".", "_")
        args.calibration = REPO / "experiments" / "calibration" / "h100_run6" / folder
    if args.profile is None:
        args.profile = REPO / "profiles" / "h100" / f"{args.model}.csv"
    return args


class Runner:
    """Runs the steps' commands with PYTHONPATH set, each under the time that is left."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.started = args, time.monotonic()
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), self.env.get("PYTHONPATH")) if p)

    def seconds_left(self) -> float:
        left = self.args.limit_s - (time.monotonic() - self.started)
        return left if self.args.step_limit_s is None else min(self.args.step_limit_s, left)

    def run(self, step: str, command: list[str] | str, log_name: str | None = None, capture: bool = False) -> str:
        text = command if isinstance(command, str) else shlex.join(command)
        if self.args.dry_run:
            print(f"[{step}] {text}")
            return "DRY_RUN"
        left = self.seconds_left()
        if left <= 5:
            print(f"=== {step}: skipped, the call's --limit-s is spent", flush=True)
            return ""
        print(f"=== {time.strftime('%H:%M:%S')} {step}: {text}", flush=True)
        name = log_name or step
        log = self.args.out / (name if "." in name else f"{name}.log")
        try:
            done = subprocess.run(command, shell=isinstance(command, str), cwd=REPO, env=self.env, timeout=left,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            output, status = done.stdout, f"exit {done.returncode}"
        except subprocess.TimeoutExpired as timeout:
            output = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else (timeout.stdout or "")
            status = f"stopped after {left:.0f} s"
        with log.open("a") as f:
            f.write(output)
        print("\n".join(output.splitlines()[-15:]) + f"\n=== {step}: {status}", flush=True)
        return output

    def python(self) -> str:
        return sys.executable or "python3"


def workload_overrides(args: argparse.Namespace, workload: str) -> list[str]:
    """A calibration stage's overrides as the calibration run recorded them, else the conf/workload group."""
    meta = args.calibration / "meta.json"
    if workload in CALIBRATION_STAGES and meta.is_file():
        stage = json.loads(meta.read_text())["stages"].get(f"compare_{workload}")
        if stage is not None:
            return list(stage["overrides"])
    return [f"workload={workload}"]


def commands(args: argparse.Namespace, runner: Runner, step: str) -> None:
    py, out = runner.python(), args.out
    if step == "wheels":
        runner.run(step, f"{py} -m pip install -q --no-index --no-deps --target {SITE} .whl/*.whl")
        if any((REPO / SERVE_WHEELS).glob("*.whl")):  # the serving tests' ASGI stack, which the image lacks
            runner.run(step, f"{py} -m pip install -q --no-index --no-deps --target {SITE} {SERVE_WHEELS}/*.whl")
        runner.env["PYTHONPATH"] += os.pathsep + SITE
    elif step == "env":
        runner.run(step, "; ".join(ENV_COMMANDS), log_name="env.txt")
    elif step == "pytest":
        # the project's addopts name plugins (xdist, benchmark) the device image may lack
        runner.run(step, [py, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-m", "gpu", "-q", "-rfE",
                          *args.tests],
                   log_name="pytest_gpu")
    elif step == "bench":
        found = runner.run(step, [py, "-m", "harness.scripting", "checkpoint", args.model]).strip().splitlines()
        if not found:
            return
        ckpt = Path(found[-1])
        runner.run(step, [py, "experiments/engine/bench_engine.py", "--ckpt-root", str(ckpt.parent), "--preset",
                          ckpt.name, "--variants", args.variants, "--out", str(out / "bench"),
                          *shlex.split(args.bench_args)])
        runner.run(step, [py, "experiments/engine/summarize.py", str(out / "bench")])
    elif step == "calibrate":
        deadline = max(0.0, runner.seconds_left() - 60)  # the last stage's compare needs time to finish
        runner.run(step, [py, "experiments/calibration/calibrate_and_compare.py", f"model={args.model}",
                          f"calibrate.out={out / args.model}", f"calibrate.workloads=[{','.join(args.workloads)}]",
                          f"calibrate.deadline_s={deadline:.0f}", f"calibrate.git_commit={args.git_commit}",
                          *args.overrides])
    elif step == "compare":
        for repeat in range(1, args.repeats + 1):
            for workload in args.workloads:
                name = f"compare_{workload}" + (f"_r{repeat}" if args.repeats > 1 else "")
                runner.run(step, [py, "-m", "harness", "experiment=compare", f"model={args.model}",
                                  f"compare.profile_path={args.profile}", "output.progress=false",
                                  *workload_overrides(args, workload), *args.overrides,
                                  f"hydra.run.dir={out / name}"], log_name=name)
    elif step == "bundle":
        runner.run(step, ["tar", "czf", str(out / "bundle.tar.gz"), "--exclude", "bundle.tar.gz", "-C", str(out), "."])
    else:
        for probe in args.probes:
            name = Path(probe).stem
            module = "experiments." + probe.removesuffix(".py").replace("/", ".")  # -m: a probe may import another
            runner.run(step, [py, "-m", module, "--model", args.model, "--out", str(out / f"probe_{name}")],
                       log_name=f"probe_{name}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runner = Runner(args)
    for step in args.steps:
        commands(args, runner, step)
    print(f"=== done in {time.monotonic() - runner.started:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
