"""fleet=disaggregated on backend=engine: P prefill and D decode engine replicas, one process
each (engine.replicas), KV moved between them over the KV link (engine.kv_link: NCCL between
GPUs, gloo on CPU), routed on the wall clock (engine.core.disagg_wall). The tables are the
simulated fleet's (harness.fleet.disagg.tabulate); transfer_s is measured from the prefill
replica posting the send to the decode replica having the blocks in its cache.

NOTE back-pressure as in the simulated fleet: a request's blocks stay held on its prefill replica
until the decode replica has room for it (first come first served) and has posted the receive;
unlike the simulated fleet, the prefill replica then releases them once their copy is taken for
the send, not when the KV lands.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import fields, replace

from engine.core.disagg_wall import run_disagg_wall
from engine.core.loop import WallClock
from engine.core.routers import RouterConfig, make_router
from harness.config import RunConfig
from harness.convert import ConfigError
from harness.fleet.config import backend_tp_size
from harness.output.summary import FitCounts, FleetLabels, RunLabels
from harness.workloads import WorkloadConfig, build_workload
from sim.kv_transfer import TransferConfig


def check_engine_settings(rc: RunConfig, fleet, pools) -> None:
    """Refuse the fleet settings only a simulated fleet reads: the KV transfer's pricing (the engine
    moves the blocks itself, and its times are measured) and a pool's GPU type (the engine serves on
    the machine's own GPUs). fleet.transfer.link stays: it checks that the pools fit one node."""
    defaults = TransferConfig(link=fleet.transfer.link)
    for field in fields(TransferConfig):
        value = getattr(fleet.transfer, field.name)
        if value != getattr(defaults, field.name):
            raise ConfigError(f"fleet.transfer.{field.name}={value!r} prices a simulated fleet's KV transfer; "
                              f"backend=engine moves and times the KV itself: leave it at its default")
    for name, pool in zip(("prefill", "decode"), pools):
        if pool.hardware.name != rc.hardware.name:
            raise ConfigError(f"fleet.{name}.hardware={getattr(fleet, name).hardware!r}: backend=engine serves on "
                              f"this machine's GPUs (the run's hardware); a pool of another GPU type is simulated only")


def run_engine_disagg(rc: RunConfig, fleet, router: RouterConfig, pools, progress: bool, step_columns,
                      check_decode_cache, tabulate):
    with engine_disagg_server(rc, fleet, router, pools, step_columns, check_decode_cache, tabulate) as serve:
        return serve(rc.workload)


@contextmanager
def engine_disagg_server(rc: RunConfig, fleet, router: RouterConfig, pools, step_columns, check_decode_cache,
                         tabulate):
    """The fleet's engine replicas, started and loaded once; yields serve(workload) -> DisaggOutcome,
    which serves a WorkloadConfig on them to completion, as often as called (each run builds fresh
    schedulers on the replicas); stops them afterwards."""
    from engine.replicas import EngineReplicas
    from harness.checkpoints import ensure_checkpoint
    from harness.labels import run_identity

    check_engine_settings(rc, fleet, pools)
    tps = [backend_tp_size(p) for p in pools]  # two sizes regroup KV heads on the link (engine.core.kv_heads)
    counts = (fleet.prefill_replicas, fleet.decode_replicas)
    ensure_checkpoint(rc.engine.model, rc.model)
    configs = [pools[0].engine] * counts[0] + [pools[1].engine] * counts[1]
    try:
        engines = EngineReplicas(configs, rc.scheduler, rc.cache, num_prefill=counts[0])
    except (ValueError, TypeError) as error:
        raise ConfigError(f"backend=engine: {error}") from None
    with engines:
        infos = engines.infos

        def serve(workload: WorkloadConfig):
            built = build_workload(workload, rc.scheduler.max_model_len, infos[0].vocab_size)
            check_decode_cache(built.requests, infos[-1].num_blocks, infos[-1].block_size, rc.scheduler.max_model_len)
            routers = [make_router(RouterConfig(name or router.name, router.prefix_blocks, router.max_imbalance),
                                   rc.cache.block_size) for name in (fleet.prefill_router, fleet.decode_router)]
            clock = WallClock()
            started = time.perf_counter()
            engines.start_run(clock)
            result = run_disagg_wall(engines, counts[0], built.requests, routers[0], routers[1], clock,
                                     rc.scheduler.max_model_len)
            wall_s = time.perf_counter() - started
            shape = FleetLabels(router=f"{fleet.prefill_router or router.name} / {fleet.decode_router or router.name}",
                                replicas=sum(counts), tp_sizes=f"{tps[0]}P {tps[1]}D",
                                gpus=counts[0] * tps[0] + counts[1] * tps[1])
            labels = RunLabels(backend=rc.backend, **run_identity(replace(rc, workload=workload)),
                               num_submitted=len(built.requests), num_rejected=len(result.rejected),
                               fit=FitCounts(**built.fit_counts()), wall_s=wall_s, fleet=shape)
            blocks = {"prefill": [i.num_blocks for i in infos[:counts[0]]],
                      "decode": [i.num_blocks for i in infos[counts[0]:]]}
            return tabulate(result, blocks, labels, counts, step_columns)

        yield serve
