"""The engine's measured cold start, as an autoscaled fleet prices a new replica's start-up.

profiles/<hardware>/<model>.cold_start.json (a conf/hardware name, a conf/model name) holds the
medians that experiments/autoscale/cold_start.py measured on that GPU: the engine process's start
(interpreter and imports), the weight load from disk (bytes/s, the page cache dropped first) and
from the page cache, the KV cache's sizing and warm-up, and CUDA graph capture; with the command
that measured them; setup_s, the engine's own set-up between its imports and its first timed
phase (the device, the attention backend), where the probe recorded it. A new replica's start-up
is then provision_s (never measured: a machine or a pod) + process + set-up + the model's weight
bytes per rank at the measured bandwidth + KV set-up + capture. weight_read names the weight read
the starts took (engine.weight_reader: "mapped" or "streamed"); a file without it was measured
with "mapped", the engine's only read then. The price is the measured one whichever read the
engine now defaults to: a calibration of the other read is a new measurement, not a rescaling.

A replica started mid-run starts beside replicas that serve. Where the probe also measured the
start with a replica serving on the same host (experiments/autoscale/midrun_dp.py's loaded probe:
the host's CPU cores, page cache and PCIe shared with a busy neighbour), the file holds that
calibration under "under_load", and it prices the start: every phase as measured under load.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from engine.config import WEIGHT_READS
from engine.core.elastic import ColdStart
from harness.convert import ConfigError
from harness.profiles import PROFILES_DIR, hardware_conf_name

log = logging.getLogger(__name__)

# the reads a start takes ("auto" resolves to one of them: engine.weight_reader.resolve_mode)
READS = tuple(m for m in WEIGHT_READS if m != "auto")

SUFFIX = ".cold_start.json"
# the fields a calibration file must carry (the probe writes more: repeats, device, medians of each phase)
FIELDS = ("tp_size", "process_s", "load_bytes_per_s", "cached_load_bytes_per_s", "kv_cache_s", "warm_up_s",
          "capture_s", "command")


@dataclass(frozen=True)
class ColdStartCalibration:
    path: Path
    tp_size: int
    process_s: float  # process start to imports done (interpreter, torch, the engine)
    load_bytes_per_s: float  # checkpoint bytes / weight-load time, read from disk
    cached_load_bytes_per_s: float  # the same with the checkpoint in the page cache
    kv_cache_s: float  # profiling the memory, allocating the KV cache
    warm_up_s: float  # the warm-up steps after allocation (none where the cache is profiled)
    capture_s: float  # CUDA graph capture
    command: str
    setup_s: float = 0.0  # imports done to the first timed phase (files from before the probe timed it: 0)
    weight_read: str = "mapped"  # the read the starts took (files from before the probe recorded it: mapped)
    under_load: ColdStartCalibration | None = None  # the same start beside a serving replica

    def cold_start(self, provision_s: float, weight_bytes_per_rank: int, eager: bool,
                   cached: bool = False) -> ColdStart:
        """The start-up of a replica of weight_bytes_per_rank per GPU: provision_s, then the measured
        phases (no capture with eager execution); cached: its checkpoint is in the page cache (a
        second replica on the machine that just loaded the first)."""
        if self.under_load is not None:
            return self.under_load.cold_start(provision_s, weight_bytes_per_rank, eager, cached)
        bandwidth = self.cached_load_bytes_per_s if cached else self.load_bytes_per_s
        return ColdStart(provision_s=provision_s, load_s=weight_bytes_per_rank / bandwidth,
                         capture_s=0.0 if eager else self.capture_s,
                         process_s=self.process_s + self.setup_s + self.kv_cache_s + self.warm_up_s)


def calibration_path(hardware_conf: str, model_name: str, root: Path | None = None) -> Path:
    return (PROFILES_DIR if root is None else root) / hardware_conf / f"{model_name}{SUFFIX}"


def read_calibration(path: Path) -> ColdStartCalibration:
    """A calibration file; ConfigError naming the file when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: not a cold-start calibration ({error})") from None
    return _calibration(data, path, str(path))


def _calibration(data: object, path: Path, where: str) -> ColdStartCalibration:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: not a cold-start calibration (a JSON object)")
    missing = [k for k in FIELDS if k not in data]
    if missing:
        raise ConfigError(f"{where}: a cold-start calibration needs {missing}")
    phases = {k: float(data[k]) for k in (*FIELDS[1:-1], "setup_s") if k in data}
    loaded = _calibration(data["under_load"], path, f"{where} under_load") if "under_load" in data else None
    read = str(data.get("weight_read", "mapped"))
    if read not in READS:
        raise ConfigError(f"{where}: weight_read must be one of {READS}, got {read!r}")
    return ColdStartCalibration(path=path, tp_size=int(data["tp_size"]), command=str(data["command"]),
                                weight_read=read, under_load=loaded, **phases)


def find_calibration(hardware_name: str, model_name: str, tp_size: int,
                     root: Path | None = None) -> ColdStartCalibration | None:
    """The measured cold start of the hardware (its spec name) and model at this TP size; None
    where none was measured (the configured placeholders price the start-up then)."""
    conf = hardware_conf_name(hardware_name)
    path = calibration_path(str(conf), model_name, root)
    if conf is None or not path.is_file():
        return None
    calibration = read_calibration(path)
    if calibration.tp_size != tp_size:
        log.info("%s was measured at TP size %d, not %d: the start-up is priced by the configured placeholders",
                 path, calibration.tp_size, tp_size)
        return None
    return calibration
