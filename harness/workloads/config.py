"""Frozen configuration of a workload: where lengths and arrival times come from, and how many.

A workload is three independent choices, each drawn from its own seeded stream (so changing the
arrival rate does not change the token ids):
- lengths: prompt_len and output_len, each uniform, fixed, lognormal (clipped to [low, high]) or
  read from a trace;
- arrivals: offline (all at t=0), poisson or gamma at `rate` req/s, or at a rate that changes over
  the run (rate_profile: harness.workloads.profile), or the trace's own times;
- token ids: uniform below max_token_id, optionally behind a shared system prompt (shared_prefix);
  a Mooncake trace's prompts (.jsonl) follow its hash_ids instead (harness.workloads.mooncake).

A setting that the chosen sources would not read (a trace path on a synthetic workload, a rate
on offline arrivals, `low` on fixed lengths) is an error, not a silent no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.convert import refuse_unread
from harness.workloads.mooncake import BLOCK_TOKENS
from harness.workloads.trace import is_mooncake

LENGTH_DISTS = ("uniform", "fixed", "lognormal", "trace")
# what each dist reads
LENGTH_FIELDS = {"uniform": ("low", "high"), "fixed": ("value",), "lognormal": ("low", "high", "median", "sigma"),
                 "trace": ()}
ARRIVALS = ("offline", "poisson", "gamma", "trace")
OVERSIZE = ("clip", "skip")


@dataclass(frozen=True)
class LengthConfig:
    """uniform: integers in [low, high] inclusive; fixed: value; lognormal: exp(N(ln median, sigma^2))
    rounded and clipped to [low, high] (a long tail above a short body: code completions'
    outputs); trace: the trace's column."""

    dist: str = "uniform"
    low: int | None = None
    high: int | None = None
    value: int | None = None
    median: float | None = None
    sigma: float | None = None

    def validate(self, where: str) -> None:
        if self.dist not in LENGTH_DISTS:
            raise ValueError(f"{where}.dist must be one of {LENGTH_DISTS}, got {self.dist!r}")
        if self.dist == "uniform":
            if self.low is None or self.high is None or not 1 <= self.low <= self.high:
                raise ValueError(f"{where} (uniform) needs 1 <= low <= high, got low={self.low}, high={self.high}")
        if self.dist == "fixed" and (self.value is None or self.value < 1):
            raise ValueError(f"{where}.value (fixed) must be an int >= 1, got {self.value}")
        if self.dist == "lognormal":
            if self.low is None or self.high is None or not 1 <= self.low <= self.high:
                raise ValueError(f"{where} (lognormal) needs 1 <= low <= high, got low={self.low}, high={self.high}")
            if self.median is None or not self.low <= self.median <= self.high:
                raise ValueError(f"{where}.median (lognormal) must be in [low, high] = [{self.low}, {self.high}], "
                                 f"got {self.median}")
            if self.sigma is None or not 0 < self.sigma <= 5:
                raise ValueError(f"{where}.sigma (lognormal) must be in (0, 5], got {self.sigma}")
        unread = [name for name in ("low", "high", "value", "median", "sigma")
                  if getattr(self, name) is not None and name not in LENGTH_FIELDS[self.dist]]
        if unread:
            settings = ", ".join(f"{where}.{name}={getattr(self, name)}" for name in unread)
            nulls = " ".join(f"{where}.{name}=null" for name in unread)
            raise ValueError(f"{settings}: not used by {where}.dist={self.dist} (it reads "
                             f"{list(LENGTH_FIELDS[self.dist]) or 'the trace column'}); set {nulls}")


@dataclass(frozen=True)
class SharedPrefixConfig:
    """A `fraction` of the requests start with one of `num_groups` system prompts of prefix_len tokens.

    The group's prompt is prepended to the request's own prompt (drawn from prompt_len), so the
    prompt grows by prefix_len tokens; the other requests get a fresh prefix of the same length,
    which keeps the token load identical across fractions.
    """

    num_groups: int = 8
    prefix_len: int = 1024
    fraction: float = 1.0

    def validate(self, where: str) -> None:
        if self.num_groups < 1:
            raise ValueError(f"{where}.num_groups must be >= 1, got {self.num_groups}")
        if self.prefix_len < 1:
            raise ValueError(f"{where}.prefix_len must be >= 1, got {self.prefix_len}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"{where}.fraction must be in [0, 1], got {self.fraction}")


@dataclass(frozen=True)
class WorkloadConfig:
    name: str | None = None  # None: the trace file's stem, or the arrival process (see label)
    num_requests: int | None = 256  # None: every row of the trace (after start_row)
    seed: int = 0
    prompt_len: LengthConfig = field(default_factory=lambda: LengthConfig("uniform", 100, 1024))
    output_len: LengthConfig = field(default_factory=lambda: LengthConfig("uniform", 100, 1024))
    arrival: str = "offline"
    rate: float | None = None  # req/s, for poisson and gamma
    cv: float = 1.0  # gamma: coefficient of variation of inter-arrival times (1 = poisson, >1 bursty)
    rate_scale: float = 1.0  # trace arrivals: times are divided by this (2 = twice the rate)
    trace_path: str | None = None  # absolute, or relative to the cwd, or to trace_dir
    trace_dir: str | None = None  # None: ../shared/traces beside the repository root
    start_row: int = 0  # first trace row used (0-based, header excluded)
    # num_requests beyond the trace's rows: true repeats the rows (times shifted a trace span plus a
    # mean gap per repeat); false serves the rows there are
    trace_repeat: bool = False
    max_token_id: int = 10000  # token ids are drawn from [0, max_token_id) (capped by the vocab)
    temperature: float = 0.6
    ignore_eos: bool = True  # lengths come from the workload, not from a random EOS
    oversize: str = "clip"  # requests longer than max_model_len: "clip" the prompt or "skip" them
    shared_prefix: SharedPrefixConfig | None = None
    # poisson/gamma at a rate that changes: [[time_s, rate], ...] (harness.workloads.profile); it then
    # sets the arrivals and their count in place of rate and num_requests
    rate_profile: tuple[tuple[float, float], ...] | None = None
    rate_period_s: float | None = None  # the profile repeats with this period
    duration_s: float | None = None  # arrivals stop here; null: see harness.workloads.profile
    # a Mooncake trace's tokens a hash id (512: Mooncake's own; aiperf, guidellm, Dynamo hash at others)
    hash_block_tokens: int = BLOCK_TOKENS

    def __post_init__(self) -> None:
        where = "workload"
        self._check_profile()
        self.prompt_len.validate(f"{where}.prompt_len")
        self.output_len.validate(f"{where}.output_len")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"{where}.num_requests must be >= 1 or null (whole trace), got {self.num_requests}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"{where}.arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        if self.arrival in ("poisson", "gamma") and self.rate_profile is None and \
                (self.rate is None or not self.rate > 0):
            raise ValueError(f"{where}.rate must be > 0 req/s for {self.arrival} arrivals, got {self.rate}")
        if not self.cv > 0:
            raise ValueError(f"{where}.cv must be > 0, got {self.cv}")
        if not self.rate_scale > 0:
            raise ValueError(f"{where}.rate_scale must be > 0, got {self.rate_scale}")
        uses_trace = self.uses_trace
        if uses_trace and not self.trace_path:
            raise ValueError(f"{where}.trace_path is required when lengths or arrivals come from a trace")
        self._check_all_read()
        if not uses_trace and self.num_requests is None and self.rate_profile is None:
            raise ValueError(f"{where}.num_requests must be set for a synthetic workload (null only for traces)")
        if self.start_row < 0:
            raise ValueError(f"{where}.start_row must be >= 0, got {self.start_row}")
        if self.max_token_id < 2:
            raise ValueError(f"{where}.max_token_id must be >= 2, got {self.max_token_id}")
        if not self.temperature >= 0:
            raise ValueError(f"{where}.temperature must be >= 0, got {self.temperature}")
        if self.oversize not in OVERSIZE:
            raise ValueError(f"{where}.oversize must be one of {OVERSIZE}, got {self.oversize!r}")
        if isinstance(self.hash_block_tokens, bool) or not isinstance(self.hash_block_tokens, int) \
                or self.hash_block_tokens < 1:
            raise ValueError(f"{where}.hash_block_tokens must be an int >= 1 (tokens a Mooncake hash id names), "
                             f"got {self.hash_block_tokens!r}")
        if self.shared_prefix is not None:
            self.shared_prefix.validate(f"{where}.shared_prefix")
            if self.reads_hash_ids:
                raise ValueError(f"{where}.shared_prefix is not used with a Mooncake trace ({self.trace_path}): its "
                                 f"hash_ids say which prompts share which blocks; set {where}.shared_prefix=null")

    def _check_profile(self) -> None:
        if self.rate_profile is None:
            for key in ("rate_period_s", "duration_s"):
                if getattr(self, key) is not None:
                    raise ValueError(f"workload.{key}={getattr(self, key)!r} is read only with workload.rate_profile")
            return
        from harness.workloads.profile import check_profile

        if self.arrival not in ("poisson", "gamma"):
            raise ValueError(f"workload.rate_profile needs workload.arrival=poisson or gamma, got {self.arrival!r} "
                             "(a trace's own arrival times: workload.arrival=trace, without a profile)")
        check_profile(self.rate_profile, self.rate_period_s, self.duration_s)

    @property
    def uses_trace(self) -> bool:
        return self.arrival == "trace" or "trace" in (self.prompt_len.dist, self.output_len.dist)

    @property
    def reads_hash_ids(self) -> bool:
        """Whether the prompts are a Mooncake trace's hash blocks (harness.workloads.mooncake)."""
        return self.prompt_len.dist == "trace" and self.trace_path is not None and is_mooncake(self.trace_path)

    @property
    def label(self) -> str:
        """The name runs are filed under: `name` when set, else the trace file's stem, else the arrival process."""
        if self.name:
            return self.name
        if not self.uses_trace:
            return self.arrival
        name = Path(str(self.trace_path)).name
        return Path(name[: -len(".gz")] if name.lower().endswith(".gz") else name).stem  # x.jsonl.gz: x

    def _check_all_read(self) -> None:
        """Settings the chosen sources would ignore are errors naming the workload and what would read them."""
        sources = (f"arrival={self.arrival}, prompt_len.dist={self.prompt_len.dist}, "
                   f"output_len.dist={self.output_len.dist}")
        unread = []
        if not self.uses_trace:
            unread += [(k, "workload.arrival=trace or a length dist=trace (e.g. workload=trace)")
                       for k in ("trace_path", "trace_dir", "start_row", "trace_repeat")]
        if self.rate_profile is not None:
            unread.append(("trace_repeat", "workload.num_requests (a rate_profile reuses rows as it needs)"))
        elif self.num_requests is None:  # the whole trace, once: nothing to repeat up to
            unread.append(("trace_repeat", "workload.num_requests=N (N requests, the rows repeated to make them)"))
        if self.arrival != "trace":
            unread.append(("rate_scale", "workload.arrival=trace (e.g. workload=trace)"))
        if self.arrival not in ("poisson", "gamma"):
            unread.append(("rate", "workload.arrival=poisson or gamma"))
        if self.arrival != "gamma":
            unread.append(("cv", "workload.arrival=gamma"))
        if not self.reads_hash_ids:
            unread.append(("hash_block_tokens", "a Mooncake trace's prompts (workload=mooncake; the export's "
                                                "size: python -m harness.workloads.export --block-tokens N)"))
        refuse_unread(self, "workload", unread, f"workload {self.label!r} ({sources})")
