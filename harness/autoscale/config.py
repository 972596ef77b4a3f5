"""The autoscale and slo sections of the composed config, as frozen dataclasses.

autoscale -> AutoscaleConfig (policy, bounds, cooldowns, thresholds, priced cold start)
slo       -> SLO (P90 TTFT and TPOT targets, each optional here)
fleet.replicas is the starting count; the start-up time of a new replica is
provision_s + the model's weight bytes / hardware.weight_load_bytes_per_s + graph_capture_s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from omegaconf import DictConfig

from engine.core import Request
from engine.core.elastic import ColdStart, Scaling
from harness.convert import ConfigError, refuse_unread, to_dataclass

UTILISATION_METRICS = ("kv", "running")
SLO_METRICS = ("ttft", "tpot")
# The most times one run may ask its policy (every interval_s while requests arrive). An evaluation
# costs about 0.1 ms on one replica, more with more (the queue and slo policies over 20,000
# evaluations on this project's CPU host), so this is minutes of policy work alone; a simulated day
# at an interval of 0.1 s stays within it.
MAX_EVALUATIONS = 1_000_000
# The most rows timeline.csv may have over the arrivals (a day at a window of 0.1 s): each is a pass
# over every replica's lifetime, and the plot draws them all.
MAX_REPORT_WINDOWS = 1_000_000


@dataclass(frozen=True)
class SLO:
    """P90 targets in seconds (None: not part of the SLO). A request attains the SLO when each set
    target holds for it; the SLO is met when at least 90% of requests attain it (P90 <= target)."""

    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    percentile: float = 90.0

    def __post_init__(self) -> None:
        for name in ("ttft_p90_s", "tpot_p90_s"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"slo.{name} must be a finite number > 0 (seconds) or null, got {value!r}")

    @property
    def is_set(self) -> bool:
        return self.ttft_p90_s is not None or self.tpot_p90_s is not None

    @property
    def target_attainment(self) -> float:
        return self.percentile / 100.0


@dataclass(frozen=True)
class AutoscaleConfig:
    """policy: a name in harness.autoscale.policies.AUTOSCALE_POLICIES, or null (a static fleet).

    utilisation: desired = ceil(serving x mean load / target), load = KV use (metric=kv, target a
    fraction) or the requests the arrival rate keeps in service per replica (metric=running,
    target_running; harness.autoscale.demand).
    queue: above target_waiting per serving replica, the replicas the arrival rate needs
    (harness.autoscale.demand), at least one more; one fewer when nothing waits.
    slo: the window's P90 of slo_metric (waiting requests' ages count as TTFTs) against the SLO:
    above slo_target x SLO the replicas the arrival rate needs if more than it has, else one more
    when the longest queue outlasts a start-up on a replica sent arrivals, or with no queue
    (harness.autoscale.demand.MissSizing);
    one fewer below slo_scale_down_below x SLO.
    schedule: schedule=[[t0, n0], [t1, n1], ...] replicas from t_i seconds (at the first evaluation
    at or after it); the only policy an engine fleet (backend=engine) takes.
    settle: while a replica starts, a scale-up only where the arrival rate needs more replicas than
    serve and start, and once it serves the policy reads only requests that arrived since
    (engine.core.elastic_states.Scaling.settle); the schedule policy, which reads the time alone,
    never settles. false: every evaluation reads everything.
    calibration: price a new replica's start-up with the measured cold start of the hardware and
    model (profiles/<hardware>/<model>.cold_start.json) where there is one; false, or without one:
    graph_capture_s and hardware.weight_load_bytes_per_s.
    """

    policy: str | None = None
    min_replicas: int = 1
    max_replicas: int = 8
    interval_s: float = 15.0
    scale_up_cooldown_s: float = 60.0
    scale_down_cooldown_s: float = 300.0
    max_scale_down: int = 1
    window_s: float = 60.0
    report_window_s: float = 60.0
    provision_s: float = 60.0
    graph_capture_s: float = 20.0
    metric: str = "running"
    target: float = 0.7
    target_running: float = 64.0
    target_waiting: float = 4.0
    slo_metric: str = "ttft"
    slo_target: float = 0.8
    slo_scale_down_below: float = 0.4
    schedule: tuple[tuple[float, float], ...] | None = None
    calibration: bool = True
    settle: bool = True

    def __post_init__(self) -> None:
        from harness.autoscale.policies import AUTOSCALE_POLICIES

        if self.policy is not None:
            AUTOSCALE_POLICIES.check(self.policy)
        for name in ("min_replicas", "max_replicas", "max_scale_down"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"autoscale.{name} must be an int >= 1, got {value!r}")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"autoscale.min_replicas={self.min_replicas} is above "
                             f"autoscale.max_replicas={self.max_replicas}")
        for name in ("interval_s", "window_s", "report_window_s", "target", "target_running", "target_waiting",
                     "slo_target", "slo_scale_down_below"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"autoscale.{name} must be a finite number > 0, got {value!r}")
        for name in ("scale_up_cooldown_s", "scale_down_cooldown_s", "provision_s", "graph_capture_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"autoscale.{name} must be a finite number >= 0 (seconds), got {value!r}")
        if self.metric not in UTILISATION_METRICS:
            raise ValueError(f"autoscale.metric must be one of {UTILISATION_METRICS}, got {self.metric!r}")
        if self.metric == "kv" and self.target > 1:
            raise ValueError(f"autoscale.target (a KV use fraction) must be in (0, 1], got {self.target}")
        if self.slo_metric not in SLO_METRICS:
            raise ValueError(f"autoscale.slo_metric must be one of {SLO_METRICS}, got {self.slo_metric!r}")
        if self.slo_scale_down_below >= self.slo_target:
            raise ValueError(f"autoscale.slo_scale_down_below={self.slo_scale_down_below} must be below "
                             f"autoscale.slo_target={self.slo_target}")
        self._check_schedule()

    def _check_schedule(self) -> None:
        where = "autoscale.schedule"
        if self.policy != "schedule":
            if self.schedule is not None:
                raise ValueError(f"{where} is read only with autoscale.policy=schedule, got policy={self.policy}")
            return
        if not self.schedule:
            raise ValueError(f"autoscale.policy=schedule needs {where}=[[time_s, replicas], ...], "
                             "e.g. '[[0,1],[60,2]]'")
        for i, pair in enumerate(self.schedule):
            if len(pair) != 2 or not all(math.isfinite(v) for v in pair):
                raise ValueError(f"{where}[{i}] must be a [time_s, replicas] pair of finite numbers, got {list(pair)}")
            time_s, count = pair
            if time_s < 0 or (i and time_s <= self.schedule[i - 1][0]):
                raise ValueError(f"{where}[{i}]: time {time_s} must be >= 0 and after the previous time "
                                 "(times increase)")
            if count != int(count) or not self.min_replicas <= count <= self.max_replicas:
                raise ValueError(f"{where}[{i}]: replicas {count} must be a whole number within "
                                 f"autoscale.min_replicas={self.min_replicas} and max_replicas={self.max_replicas}")

    def read_by(self, policies: Collection[str]) -> set[str]:
        """The policy-specific settings (RegisteredPolicy.READS) that any of policies reads."""
        from harness.autoscale.policies import AUTOSCALE_POLICIES

        return {name for policy in policies for name in AUTOSCALE_POLICIES.get(policy).reads(self)}

    def check_read(self, where: str, policies: Sequence[str], read: Collection[str] | None = None,
                   chosen: str = "") -> None:
        """A ConfigError naming the first policy-specific setting set away from its default that
        none of policies reads (read: those they read, when not read_by(policies)); chosen says
        what runs them. No policy (a static fleet): check_static."""
        from harness.autoscale.policies import AUTOSCALE_POLICIES

        if not policies:
            return
        read = self.read_by(policies) if read is None else read
        plain: dict[str, list[str]] = {}
        conditional: dict[str, list[str]] = {}
        for name, policy in AUTOSCALE_POLICIES.items():
            for key in policy.READS:
                if key in policy.READ_WHEN:
                    field, value = policy.READ_WHEN[key]
                    conditional.setdefault(key, []).append(f"{where}.policy={name} and {where}.{field}={value}")
                else:
                    plain.setdefault(key, []).append(name)
        unread = [(key, " or ".join(([f"{where}.policy=" + _either(plain[key])] if key in plain else [])
                                    + conditional.get(key, [])))
                  for key in dict.fromkeys([*plain, *conditional]) if key not in read]
        metric = f" with {where}.metric={self.metric}" if "metric" in read else ""
        try:
            refuse_unread(self, where, unread, chosen or f"{where}.policy={_either(policies)}{metric}")
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def check_static(self, where: str) -> None:
        """A ConfigError naming the first setting set away from its default: a static fleet (policy
        null) reads none of them."""
        from harness.autoscale.policies import AUTOSCALE_POLICIES

        unread = [(f.name, f"a policy ({where}.policy={_either(AUTOSCALE_POLICIES.names())})")
                  for f in dataclasses.fields(self) if f.name != "policy"]
        try:
            refuse_unread(self, where, unread, f"{where}.policy=null (a static fleet of fleet.replicas)")
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def cold_start(self, weight_bytes: int, load_bytes_per_s: float) -> ColdStart:
        """The start-up priced by the configured placeholders (no measured calibration)."""
        return ColdStart(self.provision_s, weight_bytes / load_bytes_per_s, self.graph_capture_s)

    def scaling(self, cold_start: ColdStart) -> Scaling:
        settle = self.settle and self.policy != "schedule"
        return Scaling(self.min_replicas, self.max_replicas, self.interval_s, self.scale_up_cooldown_s,
                       self.scale_down_cooldown_s, self.max_scale_down, self.window_s, cold_start, settle)


def build_autoscale(cfg: DictConfig) -> tuple[AutoscaleConfig, SLO]:
    from harness.config import section

    autoscale = to_dataclass(AutoscaleConfig, section(cfg, "autoscale"), "autoscale") if "autoscale" in cfg \
        else AutoscaleConfig()
    slo = to_dataclass(SLO, section(cfg, "slo"), "slo") if "slo" in cfg else SLO()
    if autoscale.policy is not None:
        autoscale.check_read("autoscale", (autoscale.policy,))
    slo_needed(autoscale, slo, "autoscale")
    return autoscale, slo


def _either(names: Sequence[str]) -> str:
    """a; a or b; a, b or c."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def last_arrival(requests: Iterable[Request]) -> float:
    """The time of the last arrival (s): the evaluations fall before it."""
    return max((r.arrival_time for r in requests), default=0.0)


def check_evaluations(interval_s: float, span_s: float, where: str) -> None:
    """A ConfigError when an evaluation every interval_s over span_s seconds of arrivals (the
    evaluations fall while requests arrive) would ask the policy more than MAX_EVALUATIONS times."""
    _check_count(f"{where}.interval_s", interval_s, span_s, MAX_EVALUATIONS, "MAX_EVALUATIONS",
                 lambda count: f"ask the policy {count:.3g} times over the {span_s:.4g} s of arrivals",
                 "about 0.1 ms each: ")


def check_report_windows(report_window_s: float, span_s: float, where: str) -> None:
    """A ConfigError when timeline.csv's windows of report_window_s over span_s seconds (the
    arrivals', before a run; the run's, after it) would number more than MAX_REPORT_WINDOWS."""
    _check_count(f"{where}.report_window_s", report_window_s, span_s, MAX_REPORT_WINDOWS, "MAX_REPORT_WINDOWS",
                 lambda count: f"cut {span_s:.4g} s of the run into {count:.3g} windows", "timeline.csv's rows: ")


def _check_count(setting: str, step_s: float, span_s: float, limit: int, limit_name: str,
                 what: Callable[[float], str], why: str) -> None:
    """The rule both checks share: span_s in steps of step_s may number at most limit."""
    count = span_s / step_s
    if count > limit:
        raise ConfigError(f"{setting}={step_s!r} would {what(count)}, more than {limit} ({why}"
                          f"harness.autoscale.config.{limit_name}); set {setting} >= {span_s / limit:.3g}")


def slo_needed(autoscale: AutoscaleConfig, slo: SLO, where: str) -> None:
    """A ConfigError when the policy reads an SLO target that is not set."""
    if autoscale.policy == "slo":
        target = slo.ttft_p90_s if autoscale.slo_metric == "ttft" else slo.tpot_p90_s
        if target is None:
            raise ConfigError(f"{where}.policy=slo with {where}.slo_metric={autoscale.slo_metric} needs "
                              f"slo.{autoscale.slo_metric}_p90_s (seconds), e.g. slo.{autoscale.slo_metric}_p90_s=2")


def check_fleet(autoscale: AutoscaleConfig, replicas: int, tp_sizes: tuple[int, ...], backend: str) -> None:
    """The fleet settings an autoscaled run can take: a ConfigError naming the one it cannot."""
    if backend == "engine" and autoscale.policy not in (None, "schedule"):
        raise ConfigError(f"autoscale.policy={autoscale.policy}: an engine fleet (backend=engine) scales on a "
                          "schedule only (autoscale.policy=schedule); the other policies read each replica's queue "
                          "and KV use, which engine replicas do not report")
    if tp_sizes:
        raise ConfigError("fleet.tp_sizes: an autoscaled fleet has one TP size for every replica (fleet.tp_size)")
    if not autoscale.min_replicas <= replicas <= autoscale.max_replicas:
        raise ConfigError(f"fleet.replicas={replicas} (the starting count) must be within autoscale.min_replicas="
                          f"{autoscale.min_replicas} and autoscale.max_replicas={autoscale.max_replicas}")
