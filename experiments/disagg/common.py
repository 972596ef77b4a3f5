"""What the disaggregation driver's sub-commands share: the fleet shapes (P prefill + D decode
replicas against P + D aggregated ones), the measured and simulated run configurations of one
device call, the GPU it runs on, the profile that prices it, and the call's time budget."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from engine.core.routers import RouterConfig
from harness.config import RunConfig
from harness.convert import ConfigError
from harness.fleet.config import FleetConfig
from harness.fleet.disagg_config import DisaggConfig, PoolConfig
from harness.paths import REPO_ROOT
from harness.scripting import compose_run_config
from sim.decode_programs import GH100_DECODE_PROGRAMS_PER_SM
from sim.kv_transfer import TransferConfig

ROUTER = RouterConfig("least_requests")  # both pools of a disaggregated fleet, and the aggregated fleet
GPU_NAMES = {"H100": "h100", "H200": "h200"}  # nvidia-smi name -> conf/hardware entry
TRACE = "azure_conv_2023.csv"
CARRIED_TRACE = REPO_ROOT / ".traces" / TRACE  # where a device call finds it (the lead carries .traces)
# CPU runs (the tests): the tiny model with random weights, a pinned cache, and a KV link with
# made-up figures (the CPU entry has none): they test the mechanics, not the numbers.
CPU_OVERRIDES = ("model=tiny-qwen3", "hardware=cpu", "scheduler.max_model_len=512", "cache.block_size=16",
                 "cache.num_blocks=256")
CPU_ENGINE = ("backend.device=cpu",)
CPU_LINK = TransferConfig(link="network", bandwidth=1e9, latency_s=1e-4)
# The engine's receive side (docs/disaggregation.md, "The receive's side"; transfer_parts.md): NCCL's
# point-to-point rate over NVLink between two H200s, and the lags after a decode step's end of the decode
# loop's check for landed receives and of the reserve's message to the prefill replica (the medians of
# Qwen3-8B 1P1D run 2, h200_8b_run2; a bandwidth scan), each lag's lognormal sigma below and above its
# median (pooled over the loaded cells of both 1P1D calls with kept steps, m8 and m06)
RECEIVE_BANDWIDTH, LANDING_LAG_S, SEND_LAG_S = 220e9, 0.8e-3, 1.8e-3
LANDING_LAG_SIGMA, SEND_LAG_SIGMA = (0.2, 0.4), (0.24, 0.52)


@dataclass(frozen=True)
class Pools:
    """P prefill and D decode replicas, one GPU each; the aggregated fleet beside it has P + D."""

    prefill: int
    decode: int

    @classmethod
    def parse(cls, text: str) -> Pools:
        match = re.fullmatch(r"([1-9]\d*)P([1-9]\d*)D", text)
        if match is None:
            raise ConfigError(f"--pools must look like 1P1D (P prefill and D decode replicas, each >= 1), got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    @property
    def gpus(self) -> int:
        return self.prefill + self.decode

    @property
    def label(self) -> str:
        return f"{self.prefill}P{self.decode}D"


@dataclass(frozen=True)
class Setup:
    """One call's fleets and configurations. measured: the backend of the measured side ("engine";
    "sim" in the fast tests, which run the whole driver with a simulator in the engine's place)."""

    model: str
    hardware: str
    pools: Pools
    cpu: bool = False
    measured: str = "engine"
    profile: str | None = None  # prices the simulated side; None: the roofline model (CPU runs)
    overrides: tuple[str, ...] = ()  # --set: Hydra overrides for both sides
    sim_overrides: tuple[str, ...] = ()  # --sim-set: the simulated side's alone (settings the engine has not)
    handshake: bool = True  # the simulated disaggregated fleet prices the engine's protocol
    # and its send path (engine.kv_link.BlockMover: a send waits for the prefill GPU's step in flight),
    # unlike fleet.transfer.queue_behind_step's planning default (experiments/disagg/send_path_choice.md)
    queue_behind_step: bool = True
    # the simulated prefill pool's host speed (fleet.prefill.host_scale; None: the run's backend.host_scale)
    prefill_host_scale: float | None = None
    # and the receive's side (receive_side_link), which measure calls price since 2026-11-30
    # (transfer_parts.md, "Held out"); False reproduces the calls made before
    receive_side: bool = False

    def run_config(self, side: str, scheduler: tuple[str, ...] = ()) -> RunConfig:
        """The measured ("measured") or simulated ("sim") side's RunConfig; the workload is set per run."""
        common = [f"model={self.model}", f"hardware={self.hardware}", *(CPU_OVERRIDES if self.cpu else ()),
                  *scheduler, *self.overrides]
        backend = self.measured if side == "measured" else "sim"
        if backend == "engine":
            extra = ["backend=engine", "backend.load_format=dummy", *(CPU_ENGINE if self.cpu else ())]
        elif self.profile is not None:
            extra = ["backend=sim", "backend.cost_model=profiled", f"backend.profile_path={self.profile}"]
        else:
            extra = ["backend=sim", "backend.cost_model=roofline"]
        return compose_run_config([*common, *extra, *(self.sim_overrides if side == "sim" else ())])

    def link(self, bandwidth: float | None = None, latency_s: float | None = None) -> TransferConfig:
        base = CPU_LINK if self.cpu else TransferConfig(link="nvlink")
        # NOTE the simulated side prices this engine's transfer protocol (engine.disagg_replica):
        # replicas act on transfer messages only between their steps
        link = dataclasses.replace(base, bandwidth=bandwidth if bandwidth is not None else base.bandwidth,
                                   latency_s=latency_s if latency_s is not None else base.latency_s,
                                   handshake=self.handshake, queue_behind_step=self.queue_behind_step)
        return receive_side_link(link, bandwidth is None and not self.cpu) if self.receive_side else link

    def fleet(self, mode: str, link: TransferConfig | None = None) -> DisaggConfig | FleetConfig:
        if mode == "disaggregated":
            return DisaggConfig(prefill_replicas=self.pools.prefill, decode_replicas=self.pools.decode,
                                prefill=PoolConfig(host_scale=self.prefill_host_scale), transfer=link or self.link())
        return FleetConfig(replicas=self.pools.gpus)

    def measured_fleet(self, mode: str) -> DisaggConfig | FleetConfig:
        """The measured side's fleet: an engine fleet moves and times its KV on its own host, so it
        keeps only the link of the transfer settings and no pool host speed (harness.fleet.disagg_engine
        refuses the simulator's settings)."""
        if self.measured != "engine" or mode != "disaggregated":
            return self.fleet(mode)
        return DisaggConfig(prefill_replicas=self.pools.prefill, decode_replicas=self.pools.decode,
                            transfer=TransferConfig(link=CPU_LINK.link if self.cpu else "nvlink"))

    def fleet_label(self, mode: str) -> str:
        return self.pools.label if mode == "disaggregated" else f"{self.pools.gpus}x"


def receive_side_link(link: TransferConfig, measured_bandwidth: bool = True) -> TransferConfig:
    """link with the engine's receive side priced (fleet.transfer.recv_behind_step and the two lags,
    drawn per step end and per send); measured_bandwidth: at NCCL's measured rate, not link's figure."""
    return dataclasses.replace(link, recv_behind_step=True, landing_lag_s=LANDING_LAG_S, send_lag_s=SEND_LAG_S,
                               landing_lag_sigma=LANDING_LAG_SIGMA, send_lag_sigma=SEND_LAG_SIGMA,
                               bandwidth=RECEIVE_BANDWIDTH if measured_bandwidth else link.bandwidth)


def host_settings(hardware: str) -> tuple[str, ...]:
    """The simulated side's settings for the engine fleet's own work, on where this GPU host has it
    measured: backend.fleet_intake (the router-to-replica hand-over, profiles/<hardware>/fleet_intake.json),
    backend.idle_start=null (conf/hardware's idle_start_host_s, priced by the simulator only beside
    a profile without lead fits, which price that work already: sim.idle_start_s) and
    backend.kv_scatter (a landed request's write into the decode replica's cache, conf/hardware's
    kv_scatter_*). The first two were chosen over the committed measure calls
    (experiments/disagg/ttft_variants.md: 267 -> 289 of 404 comparisons within target, no call
    losing one), the third weighed on them (experiments/disagg/kv_scatter.md); a measure
    call's --sim-set comes after them and wins."""
    from harness.fleet.intake import intake_path

    settings = []
    if intake_path(hardware).is_file():
        settings.append("backend.fleet_intake=true")
    spec = compose_run_config([f"hardware={hardware}"]).hardware
    if spec.idle_start_host_s is not None:
        settings.append("backend.idle_start=null")
    if spec.kv_scatter_base_s is not None and spec.kv_scatter_bandwidth is not None:
        settings.append("backend.kv_scatter=true")
    return tuple(settings)


GH100 = ("h100", "h200")  # the GPUs whose decode kernel's waves the measure calls price


def kernel_settings(hardware: str) -> tuple[str, ...]:
    """The simulated side's settings for the engine's decode kernel on a GPU whose occupancy is known
    (GH100): a decode step of more programs than the GPU holds at once priced with its waves, less
    what the profiling grid's own rows hold of them (backend.decode_programs_baseline=grid_waves,
    sim.decode_programs). Weighed on every committed measure call (experiments/disagg/decode_waves.md:
    599 -> 624 of 755 comparisons within target, no call losing one); the conf leaves the waves off
    for other runs (conf/hardware/h200.yaml says why)."""
    if hardware not in GH100:
        return ()
    return (f"hardware.decode_programs_per_sm={GH100_DECODE_PROGRAMS_PER_SM}",
            "backend.decode_programs_baseline=grid_waves")


def detect_gpus() -> list[str]:
    """The names nvidia-smi lists, one per GPU; a ConfigError where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        raise ConfigError("no nvidia-smi here: this driver measures GPUs (pass --cpu for the tiny-model CPU run)")
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def hardware_of(names: list[str], pools: Pools) -> str:
    """The conf/hardware entry of the GPUs, refused unless there are enough of one known kind."""
    if len(names) < pools.gpus:
        raise ConfigError(f"--pools {pools.label} needs {pools.gpus} GPUs, this machine has {len(names)}")
    kinds = {next((v for k, v in GPU_NAMES.items() if k in name), name) for name in names[:pools.gpus]}
    if len(kinds) != 1 or not kinds <= set(GPU_NAMES.values()):
        raise ConfigError(f"GPUs {names[:pools.gpus]}: the driver knows {list(GPU_NAMES)} (one kind per call); "
                          "pass --hardware to name the conf/hardware entry")
    return kinds.pop()


def profile_for(hardware: str, model: str, out: Path) -> tuple[str, str]:
    """(profile path, how it was found): the shipped profiles/<hardware>/<model>.csv, else the
    H100 one carried to this GPU by its datasheet ratios (sim.transfer), written under out."""
    shipped = REPO_ROOT / "profiles" / hardware / f"{model}.csv"
    if shipped.is_file():
        return str(shipped), f"shipped {shipped.relative_to(REPO_ROOT)}"
    source = REPO_ROOT / "profiles" / "h100" / f"{model}.csv"
    if not source.is_file():
        raise ConfigError(f"no profile of {model} on {hardware} or on h100 under profiles/: the simulated side "
                          "needs one (profiles/README.md)")
    from sim.profiled import ProfiledCostModel
    from sim.transfer import transfer

    source_rc = compose_run_config(["hardware=h100", f"model={model}"])
    target = compose_run_config([f"hardware={hardware}"]).hardware
    carried = out / f"{model}_{hardware}_from_h100.csv"
    transfer(ProfiledCostModel.load(source), source_rc.hardware, target, source_rc.model, 1).to_csv(carried)
    return str(carried), f"carried from profiles/h100/{model}.csv to {hardware} (sim.transfer)"


def trace_path(given: str | None) -> str:
    """The Azure conversation trace: --trace, else .traces/ (a device call), else the shared traces."""
    from harness.workloads import TraceError
    from harness.workloads.trace import resolve_trace_path

    if given is None and CARRIED_TRACE.is_file():
        return str(CARRIED_TRACE)
    try:
        return str(resolve_trace_path(given or TRACE))
    except TraceError as error:
        raise ConfigError(f"--trace: {error} (a device call carries it in .traces/)") from None


class Deadline:
    """The call's time budget: a part runs only if its estimate fits what is left. bundle: (the
    results folder, a .tar.gz) packed again at every log line, so a call cut short returns one
    file with every part finished so far."""

    def __init__(self, limit_s: float, bundle: tuple[Path, Path] | None = None) -> None:
        self.start, self.limit_s = time.perf_counter(), limit_s
        self.bundle = bundle

    def pack(self) -> None:
        if self.bundle is None:
            return
        folder, target = self.bundle
        partial = target.with_name(target.name + ".partial")
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(folder, arcname=folder.name)
        os.replace(partial, target)  # whole or not at all, whenever the call is cut

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, estimate_s: float) -> bool:
        return self.elapsed() + estimate_s <= self.limit_s


def log(deadline: Deadline, message: str) -> None:
    print(f"[{deadline.elapsed():6.1f} s] {message}", flush=True)
    deadline.pack()  # a log line follows each finished part's files
