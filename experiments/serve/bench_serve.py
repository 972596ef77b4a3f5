"""The engine's HTTP server against the harness's own run of the same requests, and against the
simulator-backed server: client-side TTFT / inter-token P50 and P90, and the server's overhead.

    python -m experiments.serve.bench_serve --out $OUT/serve --trace-dir .traces   # on a GPU

Cases: each workload (--workloads: azure = the Azure conversation trace, mooncake = Mooncake's
conversation trace, poisson = synthetic) at each load (--loads, fractions of the capacity: --capacity
in requests/s, or `auto`: the simulator's offline throughput of the same requests with the GPU's
profiled cost model). The same requests (harness.workloads.build; workload.seed differs per load,
so one case's prompts are never cached for the next) are
  1. run by the harness's own loop (experiments/serve/harness_runs.py: one engine for every case);
  2. replayed by experiments/serve/client.py (stdlib asyncio; or by aiperf with --loadgen aiperf:
     experiments/serve/aiperf.py) against `python -m harness.serve` with the engine, one server for
     every case, and then
  3. against `python -m harness.serve backend=sim ... backend.cost_model=profiled` at time_scale=1.
--cases keeps some of them (each with the requests and rate it has among all of them).
Results are written after each stage, so a run cut short keeps what it finished: serve.csv (one
row per case and source), overhead.csv (per case and server), serve.md (the tables), and each
stage's run folder packed as one tarball (harness.tar.gz: harness/<case>/; engine_server.tar.gz and
sim_server.tar.gz: the server's requests.csv, serve_overhead.csv and each case's client records):
at most six files, none deeper than --out, as a device hands back (--no-pack keeps the folders).
The engine's stages keep their per-step tables (steps.csv.gz, with each step's features and
measured times), so the simulator's price of every step the engine ran can be checked on a CPU
afterwards (experiments/serve/step_prices.py); the simulator server's table, which a CPU makes
again from the same requests, is dropped unless --keep-steps.

The simulator's server is priced at the engine server's host (--sim-host engine, the default: the
speed its core process launched steps at, measured as the held-out protocol measures a cell's
host: experiments/serve/host.py); serve.csv's host_scale column gives each case's measured speed
(harness_run, engine_server_own) and the one the simulator's server was priced at (sim_server_own).
--merge DIR keeps an earlier output's rows and packs of the stages not run now
(experiments/serve/outputs.py), so a call cut short in the simulator server's stage is finished by
`--stages sim --merge EARLIER`. It prices a shared prefix's blocks read again in a decode step as
overlapping the first reads (backend.repeated_reads=overlap, sim/overlapped_reads.py: Mooncake's
served decode steps, which share 512 tokens a prompt, priced within 1.5%, against +3-5% additive),
and a decode step's attention by its split-KV programs in waves of 5 an SM, less the grid's own
waves (backend.decode_programs_baseline=grid_waves with hardware.decode_programs_per_sm=5: Azure's
inter-token latency within 2.1% where grid_spread left it 2.7-6.8% short; h200_run12_baseline/),
on an H100 or H200 prices decode graph launches by the launch line of a committed grid
(split_inputs.LAUNCH_LINE_GRIDS; docs/host_speed.md; h200_run9_aiperf/), and plans a step after the
prefill in flight's launches (backend.plan_after_launches: burst_split.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from experiments.serve import aiperf, host, outputs
from experiments.serve.cases import WORKLOADS, Case, case_tags, plan_cases
from experiments.serve.client import replay
from experiments.serve.loop_figures import sim_loop_overrides
from experiments.serve.outputs import MEASURED_STAGES, STAGE_FOLDERS, STAGES, drop_steps, pack
from experiments.serve.split_inputs import SIM_SERVER_DEFAULTS, launch_line_default
from experiments.serve.tables import case_requests, harness_row, markdown, server_rows
from harness.scripting import compose_run_config
from harness.serve.process import ServerProcess
from sim.profiled import ProfiledCostModel

HostOf = Callable[[pd.DataFrame], float]  # a case's host speed from its steps

SIM_DEFAULT = ["backend=sim", "model=qwen3-0.6b", "backend.cost_model=profiled", *SIM_SERVER_DEFAULTS]
GPUS = {"H100": "h100", "H200": "h200", "A100": "a100"}  # a name in nvidia-smi's -> conf/hardware


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--capacity", default="auto",
                        help="requests/s at 100%% load: auto (the simulator's offline throughput), a number, or "
                             "per workload as azure=40,mooncake=12")
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 0.8])
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=["azure", "mooncake"])
    parser.add_argument("--num-requests", type=lambda s: [int(x) for x in s.split(",")], default=[400, 200],
                        help="requests per case: one number, or one per workload")
    parser.add_argument("--hardware", default="auto", help="conf/hardware name; auto: the GPU nvidia-smi names")
    parser.add_argument("--trace-dir", default=None, help="folder of the trace files (default: ../shared/traces)")
    parser.add_argument("--engine", nargs="*", default=["backend=engine", "model=qwen3-0.6b",
                                                        "backend.load_format=dummy"],
                        help="overrides of the engine's run and server")
    parser.add_argument("--sim", nargs="*", default=None,
                        help="overrides of the simulator-backed server (default: Qwen3-0.6B's profiled model, "
                             "repeated KV reads overlapped, ragged decode batches priced by their programs, and on "
                             "an H100 or H200 decode graph launches priced by the launch line)")
    parser.add_argument("--engine-server", nargs="*", default=[],
                        help="serve.* settings of the engine's server alone (e.g. serve.early_tokens=false)")
    parser.add_argument("--workload", nargs="*", default=[], help="more workload overrides (lengths)")
    parser.add_argument("--stages", type=lambda s: s.split(","), default=["harness", "engine", "sim"])
    parser.add_argument("--cases", type=lambda s: s.split(","), default=None,
                        help="run only these of the --workloads x --loads cases (e.g. azure_50,mooncake_50); each "
                             "keeps the requests and rate it has in the full set")
    parser.add_argument("--loadgen", choices=["client", "aiperf"], default="client",
                        help="who replays the requests against the servers: the in-repo client, or aiperf "
                             "(experiments/serve/aiperf.py)")
    parser.add_argument("--aiperf", default=None,
                        help=f"the command that runs aiperf (default: ${aiperf.ENV_VAR}, else python -m aiperf)")
    parser.add_argument("--no-pack", dest="pack", action="store_false",
                        help="keep each stage's run folder as it is (by default packed into <folder>.tar.gz)")
    parser.add_argument("--keep-steps", action="store_true",
                        help="keep the simulator server's per-step table too (the engine's stages always keep theirs)")
    parser.add_argument("--sim-host", default="engine",
                        help="the host the simulator's server is priced at: engine (the engine server's measured "
                             "speed), profile (the profile's host) or a speed > 0 (backend.host_scale)")
    parser.add_argument("--sim-loop", default="off", help="the simulator server's loop work: off, or LOOP_S,PER_SEQ_S,"
                        "EXTRA_S,EXTRA_PER_SEQ_S (backend.loop_s, loop_per_seq_s, serve.loop_extra_s, "
                        "loop_extra_per_seq_s; experiments/serve/loop_figures.py)")
    parser.add_argument("--merge", type=Path, default=None,
                        help="an earlier output of the same cases: its rows and packs of the stages not run now are "
                             "kept (and its engine server's host read, for --sim-host engine)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    bad_stages = sorted(set(args.stages) - set(STAGES))
    if unknown or bad_stages:
        parser.error(f"--workloads from {sorted(WORKLOADS)}, --stages from {','.join(STAGES)}; "
                     f"got {unknown + bad_stages}")
    try:
        args.sim_host = host.parse_choice(args.sim_host)
        args.sim_loop = sim_loop_overrides(args.sim_loop)
    except ValueError as error:
        parser.error(str(error))
    if not all(o.startswith("serve.") for o in args.engine_server):
        parser.error(f"--engine-server takes serve.* settings, got {args.engine_server}")
    if any(o.startswith("backend.host_scale=") for o in args.sim or []):
        parser.error("--sim: give the simulator's host by --sim-host, not backend.host_scale")
    if args.merge is not None and (why := outputs.check_earlier(args.merge)):
        parser.error(why)
    if "sim" in args.stages and args.sim_host == "engine" and "engine" not in args.stages and args.merge is None:
        parser.error("--sim-host engine without the engine stage needs --merge (an output with "
                     "engine_server.tar.gz); or give --sim-host profile or a number")
    if not all(0 < x <= 1.5 for x in args.loads):
        parser.error(f"--loads must be fractions of capacity in (0, 1.5], got {args.loads}")
    if len(args.num_requests) not in (1, len(args.workloads)) or min(args.num_requests) < 2:
        parser.error(f"--num-requests: one count >= 2, or one per workload; got {args.num_requests}")
    if args.cases is not None:
        tags = case_tags(args.workloads, args.loads)
        if not args.cases or sorted(set(args.cases) - set(tags)):
            parser.error(f"--cases: {sorted(set(args.cases) - set(tags)) or args.cases} not among the cases of "
                         f"--workloads x --loads: {','.join(tags)}")
    args.capacities = capacities(parser, args.capacity, args.workloads)
    return args


def capacities(parser: argparse.ArgumentParser, text: str, workloads: list[str]) -> dict[str, float | None]:
    try:
        if text == "auto":
            return dict.fromkeys(workloads)
        if "=" not in text:
            return dict.fromkeys(workloads, float(text))
        given = {k: float(v) for k, v in (item.split("=") for item in text.split(","))}
        if set(workloads) - set(given) or min(given.values()) <= 0:
            raise ValueError
        return given
    except ValueError:
        parser.error(f"--capacity: auto, a number > 0, or name=number for each of {workloads}; got {text!r}")
        raise


def gpu_hardware(given: str) -> str:
    if given != "auto":
        return given
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], check=True,
                               capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("error: --hardware auto needs nvidia-smi; name the hardware (--hardware h100)") from None
    for key, name in GPUS.items():
        if key in names:
            return name
    raise SystemExit(f"error: no conf/hardware for the GPU {names.strip()!r}; pass --hardware")


def with_hardware(overrides: list[str], hardware: str) -> list[str]:
    return overrides if any(o.startswith("hardware=") for o in overrides) else [*overrides, f"hardware={hardware}"]


def run_harness(engine: list[str], cases: list[Case], out: Path, host_of: HostOf | None) -> list[dict]:
    plan = [{"overrides": [*engine, *case.overrides, "output.plots=false"], "out": str(out / "harness" / case.tag)}
            for case in cases]
    (out / "harness").mkdir(parents=True, exist_ok=True)
    (out / "harness" / "plan.json").write_text(json.dumps(plan, indent=1))
    subprocess.run([sys.executable, "-m", "experiments.serve.harness_runs", str(out / "harness" / "plan.json")],
                   check=True)
    rows = []
    for case in cases:
        folder = out / "harness" / case.tag
        steps = pd.read_csv(folder / "steps.csv.gz")
        rows.append({**case_key(case), **harness_row(pd.read_csv(folder / "requests.csv"), steps),
                     **({"host_scale": host_of(steps)} if host_of else {})})
    return rows


def run_server(server: str, overrides: list[str], cases: list[Case], out: Path,
               loadgen: list[str] | None = None, host_of: HostOf | None = None) -> tuple[list[dict], list[dict]]:
    """Each case replayed against one server: by the in-repo client, or by the aiperf command loadgen;
    host_of gives each case's `own` row its host_scale from the case's steps."""
    folder = out / server
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    clients, figures = {}, {}
    words, extra = None, []
    if loadgen is not None:
        rc = compose_run_config([o for o in overrides if not o.startswith("serve.")])  # a run's config has no serve
        words, extra = aiperf.server_text(rc, folder / "word_tokenizer")  # removed once the server stops
    process = ServerProcess([*overrides, *extra, "output.plots=false", "serve.max_queue=8192"], folder)
    process.start(timeout_s=600)  # an engine's start-up: weights, memory profile, CUDA graphs
    try:
        with urllib.request.urlopen(process.base_url + "/models") as response:
            model = json.load(response)["data"][0]["id"]
        for case in cases:
            if loadgen is None or words is None:
                clients[case.tag] = replay_case(server, process.base_url, model, case, folder)
                continue
            began = time.perf_counter()
            clients[case.tag], figures[case.tag] = aiperf.replay(loadgen, process.base_url, model, case.requests,
                                                                 words, folder, case.tag)
            services, tokenizer = aiperf.setup_s(folder / f"aiperf_{case.tag}")
            print(f"{server} {case.tag}: aiperf, {len(case.requests)} requests in {time.perf_counter() - began:.0f} s "
                  f"(its set-up {services:.1f} s, of which its tokenizer {tokenizer:.1f} s)", flush=True)
    finally:
        process.stop()
        if words is not None:
            shutil.rmtree(words)
    requests, steps = pd.read_csv(folder / "requests.csv"), pd.read_csv(folder / "steps.csv.gz")
    rows, overheads = [], []
    owns = case_requests(requests, [len(c.requests) for c in cases], [clients[c.tag] for c in cases])
    for case, own in zip(cases, owns, strict=True):
        pair, overhead = server_rows(server, clients[case.tag], own, steps, "client" if loadgen is None else "aiperf",
                                     figures.get(case.tag))
        if host_of is not None:
            pair[1]["host_scale"] = host_of(host.in_window(steps, own["arrival"].min(), own["finish"].max()))
        rows += [{**case_key(case), **row} for row in pair]
        overheads.append({"workload": case.name, "load": case.load, **overhead})
    return rows, overheads


def replay_case(server: str, base_url: str, model: str, case: Case, folder: Path) -> pd.DataFrame:
    began = time.perf_counter()
    records = pd.DataFrame([vars(r) for r in asyncio.run(replay(base_url, model, case.requests))])
    records.to_csv(folder / f"client_{case.tag}.csv", index=False)
    errors = records["error"].dropna()
    if len(errors):
        raise RuntimeError(f"{server} {case.tag}: {len(errors)} requests failed, first: {errors.iloc[0]}")
    print(f"{server} {case.tag}: {len(records)} requests in {time.perf_counter() - began:.0f} s", flush=True)
    return records


def case_key(case: Case) -> dict:
    return {"workload": case.name, "load": case.load, "rate_rps": case.rate}


def sim_stage(args: argparse.Namespace, sim: list[str], cases: list[Case], loadgen: list[str] | None,
              model: ProfiledCostModel | None) -> tuple[list[dict], list[dict]]:
    """The simulator's server at the host --sim-host names (the engine server's, measured from the
    step table this run's engine stage or --merge's output left in --out)."""
    steps = host.server_steps(args.out, STAGE_FOLDERS["engine"]) if args.sim_host == "engine" else None
    scale = host.sim_host(args.sim_host, steps, model)
    print(f"sim_server: priced at host speed {scale:.4g} (--sim-host {args.sim_host})", flush=True)
    return run_server(STAGE_FOLDERS["sim"], [*sim, *args.sim_loop, f"backend.host_scale={scale:.6g}"], cases,
                      args.out, loadgen, lambda _: scale)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    hardware = gpu_hardware(args.hardware)
    if args.sim is None:
        args.sim = [*SIM_DEFAULT, *launch_line_default(hardware)]
    engine, sim = with_hardware(args.engine, hardware), with_hardware([*args.sim, "serve.time_scale=1"], hardware)
    args.sim = with_hardware(args.sim, hardware)
    loadgen = None
    if args.loadgen == "aiperf" and {"engine", "sim"} & set(args.stages):
        loadgen = aiperf.command(args.aiperf)
        try:
            aiperf.check(loadgen)
        except RuntimeError as error:
            raise SystemExit(f"error: --loadgen aiperf: {error}") from None
    model = host.profile_model(args.sim)
    if model is None and args.sim_host == "engine" and "sim" in args.stages:
        raise SystemExit("error: --sim-host engine needs the simulator's server on the profiled cost model "
                         "(backend.cost_model=profiled); give --sim-host profile or a number")
    host_of = None if model is None else (lambda steps: host.measured(steps, model)[0])
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cases = [case for case in plan_cases(args, engine) if args.cases is None or case.tag in args.cases]
    results = outputs.merged(args, cases)
    stages = {"harness": lambda: (run_harness(engine, cases, args.out, host_of), []),
              "engine": lambda: run_server(STAGE_FOLDERS["engine"], [*engine, *args.engine_server], cases, args.out,
                                           loadgen, host_of),
              "sim": lambda: sim_stage(args, sim, cases, loadgen, model)}
    failed = []
    for stage in args.stages:
        try:  # a stage that fails leaves the others to run: one device call gets what it can
            results[stage] = stages[stage]()
        except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
            failed.append(stage)
            if args.pack:  # what the stage left (its server's log) is the clue
                pack(args.out, STAGE_FOLDERS[stage])
            print(f"stage {stage} FAILED at {time.perf_counter() - started:.0f} s: {error}", flush=True)
            continue
        outputs.write(args.out, results)
        if not args.keep_steps and stage not in MEASURED_STAGES:
            drop_steps(args.out / STAGE_FOLDERS[stage])
        if args.pack:
            pack(args.out, STAGE_FOLDERS[stage])
        print(f"stage {stage} done at {time.perf_counter() - started:.0f} s", flush=True)
    frame, overhead = outputs.write(args.out, results)
    print(markdown(frame, overhead))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
