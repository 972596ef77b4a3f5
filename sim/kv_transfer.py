"""The price of moving a request's prompt KV from a prefill replica to a decode replica.

bytes = prompt tokens x the KV bytes per token the decode pool stores (all layers; per rank
times its TP size, so KV heads replicated across ranks are sent to each). The KV heads move by
the engine's plan (engine.core.kv_heads.reshard_plan: between two TP sizes each prefill rank
sends each decode rank the heads it holds for it), every GPU over its own link, so the GPU that
sends or receives the most heads sets the time; its share is 1 / min(tp_prefill, tp_decode) of
the bytes, rounded up to whole heads (one KV head on 2 prefill ranks, replicated on 3 decode
ranks: one prefill GPU sends it twice, 2/3 of the bytes):

    transfer_s = latency + bytes / (streams x bandwidth),  streams = heads moved / busiest GPU's heads

with bandwidth the per-GPU, one-way figure of the link (hardware.nvlink_bandwidth inside a node,
hardware.network_bandwidth between nodes; the slower GPU type's where pools differ) and latency
its per-transfer cost. Concurrent transfers do not slow each other (no contention model).

Layer-by-layer overlap (layerwise=True): layer i's KV is sent while layers > i are computed. With
L layers, a prefill of p seconds and a transfer of x = bytes / bandwidth, the last layer's KV
lands max(x / L, x - p (L - 1) / L) after the prefill ends (a pipeline whose slower stage sets
the pace), plus the latency. engine.core.disagg_fleet passes p = 0 for a transfer that had to
wait for a decode replica (the KV was complete before it could start).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.kv_heads import busiest_rank_heads, reshard_plan
from sim.specs import HardwareSpec, ModelSpec

LINKS = ("nvlink", "network")


@dataclass(frozen=True)
class TransferConfig:
    """fleet.transfer: link (nvlink | network); bandwidth (bytes/s per GPU, one way) and latency_s
    override the hardware's figures for that link (null: the hardware's); layerwise: overlap the
    transfer with the prefill layer by layer; handshake: the engine's protocol, where the replicas
    act on transfer messages only between their steps (engine.core.disagg_events); queue_behind_step:
    the engine's block moves, a send queued on the prefill GPU behind its step in flight (ignored,
    by sends_queue_behind_step, with layerwise, whose layers leave during the prefill); recv_behind_step:
    the receive's side, posted as the decode replica reserves and queued behind its step in flight
    there (receives_queue_behind_step: not with layerwise either); landing_lag_s: with handshake, the
    decode loop checks for landed receives that long after each step's end; send_lag_s: with handshake,
    the prefill replica is told to send that long after the decode replica reserved; landing_lag_sigma,
    send_lag_sigma: each lag drawn per step end (per send) from a lognormal with that median and
    sigma (engine.core.transfer_receive.LagDraw; 0: fixed)."""

    link: str = "nvlink"
    bandwidth: float | None = None
    latency_s: float | None = None
    layerwise: bool = False
    handshake: bool = False
    queue_behind_step: bool = False
    recv_behind_step: bool = False
    landing_lag_s: float = 0.0
    send_lag_s: float = 0.0
    landing_lag_sigma: float | tuple[float, float] = 0.0
    send_lag_sigma: float | tuple[float, float] = 0.0

    def __post_init__(self) -> None:
        if self.link not in LINKS:
            raise ValueError(f"fleet.transfer.link must be one of {list(LINKS)}, got {self.link!r}")
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise ValueError(f"fleet.transfer.bandwidth must be > 0 (bytes/s) or null, got {self.bandwidth!r}")
        if self.latency_s is not None and not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"fleet.transfer.latency_s must be a number >= 0 or null, got {self.latency_s!r}")
        if not isinstance(self.layerwise, bool):
            raise ValueError(f"fleet.transfer.layerwise must be true or false, got {self.layerwise!r}")
        if not isinstance(self.handshake, bool):
            raise ValueError(f"fleet.transfer.handshake must be true or false, got {self.handshake!r}")
        if not isinstance(self.queue_behind_step, bool):
            raise ValueError(f"fleet.transfer.queue_behind_step must be true or false, got {self.queue_behind_step!r}")
        if not isinstance(self.recv_behind_step, bool):
            raise ValueError(f"fleet.transfer.recv_behind_step must be true or false, got {self.recv_behind_step!r}")
        for name in ("landing_lag_s", "send_lag_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1):
                raise ValueError(f"fleet.transfer.{name} must be seconds in [0, 1), got {value!r}")
            if value and not self.handshake:
                raise ValueError(f"fleet.transfer.{name} prices the engine's protocol: it needs "
                                 f"fleet.transfer.handshake=true (or {name}=0)")
        for name in ("landing_lag_sigma", "send_lag_sigma"):
            object.__setattr__(self, name, _sigma(name, getattr(self, name)))

    def sends_queue_behind_step(self) -> bool:
        """Whether a send waits for the prefill replica's step in flight (engine.core.disagg_events):
        not a layer-by-layer one, whose layers leave while the prefill computes."""
        return self.queue_behind_step and not self.layerwise

    def receives_queue_behind_step(self) -> bool:
        """Whether the wire waits for the decode replica's step in flight as it posted the receive
        (engine.core.disagg_events): not for a layer-by-layer transfer."""
        return self.recv_behind_step and not self.layerwise


def _sigma(name: str, value: object) -> float | tuple[float, float]:
    """A lag's lognormal sigma: one number, or [below, above] the median; each in [0, 2]."""
    parts = [value] if isinstance(value, int | float) else list(value) if isinstance(value, Sequence) else None
    if (parts is None or len(parts) not in (1, 2) or isinstance(value, str)
            or not all(isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p <= 2 for p in parts)):
        raise ValueError(f"fleet.transfer.{name} must be a lognormal sigma in [0, 2] or [below, above] "
                         f"the median, got {value!r}")
    return float(parts[0]) if isinstance(value, int | float) else (float(parts[0]), float(parts[-1]))


def link_figures(config: TransferConfig, prefill: HardwareSpec, decode: HardwareSpec) -> tuple[float, float]:
    """(bytes/s per GPU one way, seconds per transfer) of the configured link between the pools."""
    figures = []
    for name in ("bandwidth", "latency_s"):
        override = getattr(config, name)
        if override is not None:
            figures.append(float(override))
            continue
        key = f"{config.link}_{name}"
        values = [getattr(spec, key) for spec in (prefill, decode)]
        for spec, value in zip((prefill, decode), values):
            if value is None:
                raise ValueError(f"hardware {spec.name} has no {key}: fleet.transfer.link={config.link} needs it "
                                 f"(or set fleet.transfer.{name})")
        figures.append(min(values) if name == "bandwidth" else max(values))
    return figures[0], figures[1]


def transfer_streams(num_kv_heads: int, prefill_tp: int, decode_tp: int) -> float:
    """How many GPUs' links a transfer's bytes divide over: all heads moved over the busiest
    GPU's (min(prefill_tp, decode_tp) wherever that comes out whole)."""
    plan = reshard_plan(num_kv_heads, prefill_tp, decode_tp)
    heads, busiest = sum(p.count for p in plan), busiest_rank_heads(plan)
    return heads // busiest if heads % busiest == 0 else heads / busiest


class KVTransferPricer:
    """engine.core.disagg_events.TransferPricer for pools of fixed TP sizes over one link kind."""

    def __init__(self, config: TransferConfig, model: ModelSpec, prefill: HardwareSpec, decode: HardwareSpec,
                 prefill_tp: int, decode_tp: int) -> None:
        self.bandwidth, self.latency_s = link_figures(config, prefill, decode)
        self.bytes_per_token = model.kv_bytes_per_token_per_rank(decode_tp) * decode_tp
        self.streams = transfer_streams(model.num_kv_heads, prefill_tp, decode_tp)
        self.num_layers = model.num_layers
        self.layerwise = config.layerwise

    def price(self, num_tokens: int, prefill: int, decode: int, overlap_s: float) -> tuple[float, int]:
        nbytes = num_tokens * self.bytes_per_token
        wire = nbytes / (self.streams * self.bandwidth)
        if self.layerwise:
            layers = self.num_layers
            wire = max(wire / layers, wire - overlap_s * (layers - 1) / layers)
        return self.latency_s + wire, nbytes
