"""Where each server's client-side TTFT comes from in a served benchmark, and how much of the
simulator server's difference from the engine server's is the simulator's prediction.

    python -m experiments.serve.ttft_split OUT [--trace-dir DIR] [--cases azure_50] [--set KEY=VALUE ...]

OUT: bench_serve's --out folder (harness.tar.gz, engine_server.tar.gz, sim_server.tar.gz, or the
folders they pack). A server whose folder has no requests.csv (a run cut short while it served),
or is missing (the simulator server's stage run elsewhere), is left out of every table, and the
rows about it with it. Every simulation takes the settings the simulator's server ran with (its
backend.* and hardware.* overrides, its serve.loop_extra_* added to backend.loop_*; bench_serve's
defaults where its folder is missing: split_inputs.SIM_SERVER_DEFAULTS); --set adds predictions made again with
other settings (a model change, re-simulated: rows marked with them). Per case, four tables:

1. per server, the client's TTFT (the load generator's records: aiperf's or the in-repo client's)
   split into means: `http_in` (the app called to the core having the request) + the core's TTFT +
   `first_token_out` (token ready to socket) + the residual outside the server (client TTFT less
   the server's http_ttft: the client, the connection, the kernel, uvicorn before the app);
2. the same requests simulated offline (no HTTP, no wall clock) at the arrival times each core
   recorded: at the engine server's, the prediction of its core's TTFT and TPOT, priced at its
   measured host (experiments/serve/host.py; `host_scale`), the profile's host beside it; at the
   harness's own run of the case (no server), at its arrivals and measured host; at the simulator
   server's, at the host it ran at, what its core should have produced (its `own` figures differ
   only if it ran off its schedule); `phase_p25` / `phase_p75`: where in the simulated step
   running at its arrival each request arrived (0 as it began, 1 as the next began);
3. `prediction only`: the engine server's client TTFT and inter-token latency with its core's
   (TTFT, TPOT) replaced by the simulator's prediction, request by request; `_pct` columns against
   the engine server's client figures;
4. the simulator server's miss in five parts that add up to it (experiments/serve/miss_parts.py):
   outside the cores, its core off schedule, arrivals, the step model, the server's cost on the
   engine's steps.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core import make_scheduler
from engine.core.loop import SimulatedClock, run
from experiments.serve import aiperf
from experiments.serve.miss_parts import miss_parts
from experiments.serve.split_inputs import SERVERS, harness_run, served_overrides, server_hosts, unpack
from experiments.serve.step_prices import SIM, case_overrides
from experiments.serve.tables import case_requests
from harness.compare.tables import markdown
from harness.output.metrics import requests_frame, steps_frame
from harness.run import make_executor
from harness.scripting import compose_run_config
from harness.workloads.build import build_workload


def client_records(folder: Path, tag: str) -> pd.DataFrame:
    """The load generator's records of a case: ttft_s, itl_s, and request_id (the in-repo client)
    or prompt_tokens, output_tokens and start (aiperf, which never sees the server's ids)."""
    if (folder / f"client_{tag}.csv").is_file():
        return pd.read_csv(folder / f"client_{tag}.csv")
    rows = []
    for line in (folder / f"aiperf_{tag}" / aiperf.RECORDS).read_text().splitlines():
        record = json.loads(line)
        metrics = record["metrics"]
        value = lambda name: metrics.get(name, {}).get("value", np.nan)  # noqa: E731
        rows.append({"ttft_s": value("time_to_first_token") / 1e3, "itl_s": value("inter_token_latency") / 1e3,
                     "prompt_tokens": value("usage_prompt_tokens"), "output_tokens": value("output_sequence_length"),
                     "start": record["metadata"]["request_start_ns"]})
    return pd.DataFrame(rows)


def matched(rows: pd.DataFrame, order: str, keys: pd.DataFrame, key_order: str) -> np.ndarray:
    """For each row of keys, the index of the row of rows with the same (prompt_tokens,
    output_tokens): equal pairs are taken in time order (rows by `order`, keys by `key_order`)."""
    pools: dict[tuple, list] = defaultdict(list)
    for index, row in rows.sort_values(order, kind="stable").iterrows():
        pools[(int(row.prompt_tokens), int(row.output_tokens))].append(index)
    picked = []
    for _, key in keys.sort_values(key_order, kind="stable").iterrows():
        pool = pools.get((int(key.prompt_tokens), int(key.output_tokens)))
        if not pool:
            raise RuntimeError(f"no served request has {int(key.prompt_tokens)} prompt and "
                               f"{int(key.output_tokens)} output tokens")
        picked.append(pool.pop(0))
    return np.array(picked)[np.argsort(keys.sort_values(key_order, kind="stable").index)]


def joined(records: pd.DataFrame, own: pd.DataFrame) -> pd.DataFrame:
    """The server's requests.csv rows of a case with the client's ttft_s / itl_s beside each."""
    if "request_id" in records:
        return own.merge(records[["request_id", "ttft_s", "itl_s"]], on="request_id", validate="1:1")
    records = records.reset_index(drop=True)
    rows = own.loc[matched(own, "http_arrival", records, "start")].reset_index(drop=True)
    return rows.assign(ttft_s=records["ttft_s"].to_numpy(), itl_s=records["itl_s"].to_numpy())


def simulated_at(overrides: list[str], own: pd.DataFrame, host_scale: float = 1.0) -> pd.DataFrame:
    """The case's requests simulated with the arrival times of a server's core (own's `arrival`),
    priced at host_scale: its requests.csv, in own's row order."""
    return simulation_at(overrides, own, host_scale)[0]


def simulation_at(overrides: list[str], own: pd.DataFrame,
                  host_scale: float = 1.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """simulated_at's requests and the simulation's steps.csv (times from own's first arrival)."""
    rc = compose_run_config([*SIM, *overrides, f"backend.host_scale={host_scale:.6g}"])
    executor = make_executor(rc)
    scheduler = make_scheduler(rc.scheduler, executor.info(), rc.cache)
    block_size = scheduler.block_manager.block_size if scheduler.block_manager.enable_prefix_caching else None
    workload = build_workload(rc.workload, rc.scheduler.max_model_len, executor.info().vocab_size)
    requests = list(workload.stream(block_size, packed=True))
    keys = pd.DataFrame({"prompt_tokens": [r.num_prompt_tokens for r in requests],
                         "output_tokens": [r.max_tokens for r in requests], "order": range(len(requests))})
    rows = matched(own, "arrival", keys, "order")
    start = own["arrival"].min()
    for request, row in zip(requests, rows, strict=True):
        request.arrival_time = float(own.at[row, "arrival"] - start)
    by_id = {r.request_id: row for r, row in zip(requests, rows, strict=True)}
    result = run(scheduler, executor, sorted(requests, key=lambda r: r.arrival_time), SimulatedClock())
    frame = requests_frame(result)
    frame = frame.set_index(frame["request_id"].map(by_id)).loc[own.index]
    steps = steps_frame(result)
    return frame.assign(phase=step_phase(frame["arrival"].to_numpy(float), steps)), steps


def step_phase(arrivals: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Where in the step running at its arrival each request arrived (0: as it began, 1: as it
    ended); NaN while no step ran. Arrivals that reach a server's core at any time spread evenly
    over [0, 1]; a server that takes them only at some point of each step bunches them."""
    order = np.argsort(steps["start"].to_numpy(float))
    starts = steps["start"].to_numpy(float)[order]
    durations = steps["duration"].to_numpy(float)[order]
    i = np.clip(np.searchsorted(starts, arrivals, side="right") - 1, 0, len(starts) - 1)
    phase = (arrivals - starts[i]) / durations[i]
    return np.where((arrivals >= starts[i]) & (phase < 1), phase, np.nan)


def ms(values, q: float | None = None) -> float:
    values = np.asarray(values, dtype=float) * 1e3
    values = values[~np.isnan(values)]
    return float(values.mean() if q is None else np.percentile(values, q))


def split_row(server: str, rows: pd.DataFrame) -> dict:
    return {"server": server, "client_ttft_p50": ms(rows.ttft_s, 50), "client_ttft_p90": ms(rows.ttft_s, 90),
            "client_ttft_mean": ms(rows.ttft_s), "http_in": ms(rows.http_in), "core_ttft": ms(rows.ttft),
            "first_token_out": ms(rows.first_token_out), "residual": ms(rows.ttft_s - rows.http_ttft)}


def core_row(label: str, frame: pd.DataFrame, host_scale: float = np.nan) -> dict:
    phase = frame["phase"].dropna().to_numpy(float) if "phase" in frame else np.array([np.nan])
    return {"source": label, "host_scale": host_scale, "ttft_p50": ms(frame.ttft, 50), "ttft_p90": ms(frame.ttft, 90),
            "ttft_mean": ms(frame.ttft), "tpot_p50": ms(frame.tpot, 50), "tpot_p90": ms(frame.tpot, 90),
            "phase_p25": float(np.percentile(phase, 25)), "phase_p75": float(np.percentile(phase, 75))}


def case_tables(overrides: list[str], rows: dict[str, pd.DataFrame], hosts: dict[str, float] | None = None,
                what_if: list[str] | None = None) -> tuple[pd.DataFrame, ...]:
    """The four tables of the module docstring for one case; rows: each server's joined rows (the
    engine server's, the simulator server's and the harness run's where there are); hosts: the host
    speed each is simulated at (server_hosts; 1, the profile's, where not given); what_if: settings
    the predictions are made again with (--set), beside those the simulator server ran with."""
    hosts, what_if = hosts or {}, what_if or []
    split = pd.DataFrame([split_row(server, rows[server]) for server in SERVERS if server in rows])
    engine, engine_host = rows["engine_server"], hosts.get("engine_server", 1.0)
    at_engine = simulated_at(overrides, engine, engine_host)
    cores = [core_row("engine_server own", engine, hosts.get("engine_server", np.nan))]
    if engine_host != 1.0:
        cores.append(core_row("simulator at engine_server's arrivals, the profile's host",
                              simulated_at(overrides, engine), 1.0))
    cores.append(core_row("simulator at engine_server's arrivals", at_engine, engine_host))

    def predicted(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
        """per request, the engine server's client figures with its core's part replaced by frame's"""
        return (engine.ttft_s - engine.ttft + frame["ttft"].to_numpy(),
                engine.itl_s - engine.tpot + frame["tpot"].to_numpy())

    sources = [("engine_server client", engine.ttft_s, engine.itl_s), ("prediction only", *predicted(at_engine))]
    label = f" ({' '.join(what_if)})"
    if what_if:
        at_engine_if = simulated_at([*overrides, *what_if], engine, engine_host)
        cores.append(core_row("simulator at engine_server's arrivals" + label, at_engine_if, engine_host))
        sources.append(("prediction only" + label, *predicted(at_engine_if)))
    at_harness = None
    if "harness" in rows:  # the case's own run in the harness's loop: no server
        harness, harness_host = rows["harness"], hosts.get("harness", 1.0)
        at_harness = simulated_at(overrides, harness, harness_host)
        cores += [core_row("harness_run own", harness, harness_host),
                  core_row("simulator at harness_run's arrivals", at_harness, harness_host)]
        if what_if:
            cores.append(core_row("simulator at harness_run's arrivals" + label,
                                  simulated_at([*overrides, *what_if], harness, harness_host), harness_host))
    parts = pd.DataFrame()
    if "sim_server" in rows:
        sim = rows["sim_server"]
        sim_host = hosts.get("sim_server", 1.0)
        at_sim = simulated_at(overrides, sim, sim_host)
        cores += [core_row("sim_server own", sim), core_row("simulator at sim_server's arrivals", at_sim, sim_host)]
        sources.append(("sim_server client", sim.ttft_s, sim.itl_s))
        if at_harness is not None:
            parts = miss_parts(engine, sim, rows["harness"], at_harness, at_sim)
    core = pd.DataFrame(cores)
    client = pd.DataFrame([{"source": name, "ttft_p50": ms(ttft, 50), "ttft_p90": ms(ttft, 90),
                            "itl_p50": ms(itl, 50), "itl_p90": ms(itl, 90)} for name, ttft, itl in sources])
    for q in ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90"):
        client[f"{q}_pct"] = (client[q] / client.at[0, q] - 1) * 100
    return split, core, client, parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="bench_serve's --out folder")
    parser.add_argument("--trace-dir", default=None, help="folder of the trace files (default: the cases')")
    parser.add_argument("--cases", type=lambda s: s.split(","), default=None, help="cases (default: every case)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="backend.* or hardware.* settings to predict again with, beside the served ones")
    args = parser.parse_args(argv)
    bad = [o for o in args.set if not o.startswith(("backend.", "hardware.")) or "=" not in o]
    if bad:
        parser.error(f"--set: {bad}: give backend.<field>=<value> or hardware.<field>=<value> settings "
                     "of the simulator")
    warnings.simplefilter("ignore")  # the cost model's extrapolation warnings: the steps are what they are
    with tempfile.TemporaryDirectory() as tmp:
        folders = unpack(args.out, Path(tmp), optional=("sim_server",))
        plan = json.loads((folders["harness"] / "plan.json").read_text())
        tags = [Path(entry["out"]).name for entry in plan]
        unknown = sorted(set(args.cases or []) - set(tags))
        if unknown:
            parser.error(f"--cases: {unknown} not among the cases {tags}")
        overrides = {}
        for tag in tags:
            given = case_overrides(folders["harness"], tag)
            if args.trace_dir:
                given = [o for o in given if not o.startswith("workload.trace_dir=")]
                given.append(f"workload.trace_dir={Path(args.trace_dir).resolve()}")
            overrides[tag] = served_overrides(folders, given)
        rows: dict[str, dict[str, pd.DataFrame]] = defaultdict(dict)
        for server in SERVERS:
            if server != "engine_server" and not (folders.get(server, Path("/nonexistent")) / "requests.csv").is_file():
                print(f"{server}: no requests.csv (its stage did not finish or is not in {args.out}), left out")
                continue
            requests = pd.read_csv(folders[server] / "requests.csv")
            records = [client_records(folders[server], tag) for tag in tags]
            owns = case_requests(requests, [len(r) for r in records], records)
            for tag, own, record in zip(tags, owns, records, strict=True):
                rows[tag][server] = joined(record, own)
        hosts = server_hosts(folders, overrides[tags[0]])
        print("hosts simulated at (speed against the profile's): " +
              (", ".join(f"{k} {v:.3f}" for k, v in hosts.items()) or "the profile's"))
        for tag in args.cases or tags:
            print(f"\n## {tag}\n")
            own, harness_host = harness_run(folders["harness"] / tag, overrides[tag])
            if own is not None:
                rows[tag]["harness"] = own
            for table in case_tables(overrides[tag], rows[tag], {**hosts, "harness": harness_host}, args.set):
                if not table.empty:
                    print(markdown(table.round(2)), "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
