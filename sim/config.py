"""SimConfig: how the simulator prices steps and sizes the KV cache. Hydra builds it at the entry point."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.config import ExecutionConfig
from sim.cost_model import COST_MODELS
from sim.decode_programs import DECODE_PROGRAMS_BASELINES
from sim.device_speed import check_device_scale
from sim.host_speed import check_host_jitter, check_host_scale
from sim.moe import MAX_SKEW
from sim.moe_groups import check_shared
from sim.moe_locality import check_locality
from sim.repeated_reads import check_rule
from sim.specs import HardwareSpec


@dataclass(frozen=True)
class SimConfig:
    """cost_model: a name in sim.cost_model.COST_MODELS: "roofline" (from shapes and peaks) or
    "profiled" (fitted to profile_path, a step-timing CSV written by the engine's profiler or
    coefficients saved by ProfiledCostModel).
    vocab_size None: the model's.
    execution: the settings the engine would run with (graphs, overlap, TP size, seed, memory);
    the simulator prices the steps the engine would run under them. With overlapped steps the
    loop plans step N+1 while step N runs, so a request that arrives during step N is admitted
    one step later than with steps run one at a time, and a request that stops on EOS computes
    one discarded token.
    profile_tp_size: the tensor-parallel size the profile was measured at; None:
    execution.tensor_parallel_size. A profile measured at 1 and run at a larger size is priced
    through sim.tp_transfer.
    moe_routing_skew: how unevenly a mixture-of-experts model's router spreads tokens over its
    experts, as a Zipf exponent over the experts' popularity ranks (0: uniform; sim.moe, which also
    estimates it from an engine's observed per-expert counts: fit_routing_skew). Dense models
    ignore it.
    moe_routing_locality: how alike the tokens of one sequence route (sim.moe_locality: token j of a
    sequence draws a fresh top-k with probability 1 / (1 + locality j), else reuses an earlier
    token's); a step's distinct experts are counted from its sequences. 0: independent tokens, as
    sim.moe prices them. Measured from a profiling grid's per-step counts (fit_routing_locality).
    moe_routing_shared_prefix: price the sequences of a step that start with the same tokens (the
    same first KV block: sim.features.routing_sequences) as one routing group (the profiled model
    only). False: every sequence routes on its own. Measured by the held-out protocol from the
    grid's shared-prefix rows (harness.fidelity.routing).
    moe_routing_shared_fresh, moe_routing_shared_cap: how alike a routing group's members route
    (sim.moe_locality, sim.moe_shared_prefix): the probability that a later member's fresh draw is
    fresh for the group, and how many routings of its own the group's later members choose among
    (None: no bound). moe_routing_shared_fresh None: the group routes as one sequence of all its
    members' tokens at the locality. Fitted by the held-out protocol to the same rows.
    profile_hardware: the GPU profile_path was measured on, when it is not the run's (None: the
    run's): the fit is carried to the run's GPU by the datasheet ratios of sim.transfer.
    host_scale: the serving host's speed against the host that measured the profile: the profiled
    model's launches and host time take host_scale times the profile's, its leads keep theirs
    (sim.host_speed; 1: the profile's host). The roofline ignores it.
    device_scale: the serving GPU's step time against the GPU that measured the profile (another
    machine of the same kind): the profiled model's device work takes device_scale times the
    profile's, its host parts keep theirs (sim.device_speed; 1: the profile's GPU). Refused with
    another cost model (the roofline takes another GPU through its hardware figures).
    host_jitter: how much that host's speed moves from step to step: each step's launches and host
    time take exp(N(0, host_jitter)) times their price, drawn from (execution.seed, step) (0: one speed).
    loop_s, loop_per_seq_s: the serving loop's own host work between two overlapped submits
    (reading a result, update, schedule, recording), per step and per running sequence, in seconds
    at the profile's host (x host_scale, like the launches): a host-bound overlapped step then takes
    launch + loop, not its launches alone (sim.profiled_overlap; docs/loop-cost.md). 0: not priced.
    launch_line_grid: a profiling grid (a step-timing CSV with launch_s) whose decode graph rows
    price decode graph launches by a robust monotone line in the graph size instead of the
    profile's per-size knots (sim.launch_line; None: the profile's fit). Profiled model at its own TP.
    fast_forward: book runs of identical decode steps at once (engine.core.fast_forward), with
    outputs identical to stepping them one by one (False).
    decode_programs: the profiled model prices a decode step's attention as the engine's split-KV
    kernel runs it, waiting on its longest programs where they are too few to keep the memory busy
    (sim.decode_programs; needs the hardware's num_sms and decode_program_bandwidth, else nothing
    changes). False: by the step's total context alone.
    decode_programs_baseline: what that wait is counted from: "none" (nothing: all of it is added)
    or "grid_spread" (only what a step's contexts add over the profiling grid's even spread of as
    many sequences around the same mean, whose wait the profile's fit holds: sim.decode_programs),
    or "grid_waves" (the whole wait less what that spread's waves add: the fit holds the grid's
    waves but not the tail of its programs started together; needs decode_programs_per_sm).
    prefill_programs: a profile given as a step-timing table (a profiling grid, fitted when loaded) is
    fitted with the prefill kernel's program term, which tells a fresh prompt from a chunk after a
    cached context (sim.prefill_programs; needs the hardware's num_sms and prefill_programs_per_sm).
    Saved coefficients fitted with the term price it whatever this says; False: a grid is fitted
    without it, as before.
    decode_merge: a profile given as a step-timing table is fitted with the decode kernel's merge of
    each sequence's split partials, the longest a step runs (sim.decode_merge; needs the hardware's
    num_sms and decode_program_bandwidth). Saved coefficients fitted with it price it whatever this
    says; False: a grid is fitted without it.
    prefill_cached_kv: with prefill_programs, such a grid's prefill fits also take the K/V bytes of
    each step's cached context (sim.prefill_programs, PREFILL_CACHED_KV_BYTES). False: not fitted.
    repeated_reads: how the profiled model prices KV blocks that sequences sharing a prefix read
    again in one decode step, where its profile did not measure them: "additive" (each at L2's
    price, after the memory reads: sim.repeated_reads) or "overlap" (the read takes the slower of
    the memory and L2 pipes, so a few repeats cost nothing: sim.overlapped_reads).
    fleet_intake: a fleet of simulated replicas (fleet.replicas, fleet=disaggregated's prefill pool,
    an autoscaled fleet) prices the engine fleet's request intake: the router's hand-over of each
    request to its replica's process, measured on the GPU host (profiles/<hardware>/fleet_intake.json,
    harness.fleet.intake; engine.core.intake). A single run has none. False: a replica sees a request
    at its arrival.
    plan_after_launches: the loop plans the next step only once the prefill step in flight's submit()
    returned, at its priced launches (engine.core.loop.Replica.plan_time), so arrivals meanwhile join
    it, as the engine's loop admits them. False (the default, which the committed held-out table was
    simulated with): at the previous step's end on the device.
    idle_start: a step submitted onto an idle device waits the hardware's idle_start_host_s first
    (sim.executor: the loop's planning, the device clock's anchor, the batch's building; needs that
    figure and overlapped steps, execution.async_scheduling). False: it starts at once. None: where
    measured (the held-out protocol's, fidelity.idle_start): true for a profiled model without lead
    fits on hardware with the figure and overlapped steps, false elsewhere (sim.idle_start_s).
    power_curve: a GPU at its power limit: the profiled model prices each step's device work longer
    by the prefill tokens a second of the steps just before it, as this curve (a JSON file,
    profiles/<hardware>/<model>.power.json) measured for the run's model and GPU (sim.power_limit).
    None: every step at the profile's burst speed.
    kv_scatter: a disaggregated decode replica's next step first waits its device's write of each
    request that landed since into the paged cache (the hardware's kv_scatter_base_s and
    kv_scatter_bandwidth; sim.executor). False: a landed request's KV is in the cache at once.
    """

    cost_model: str = "roofline"
    profile_path: str | None = None
    activation_reserve_bytes: int | None = None
    vocab_size: int | None = None
    eos_token_id: int | None = None
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    profile_tp_size: int | None = None
    moe_routing_skew: float = 0.0
    moe_routing_locality: float = 0.0
    moe_routing_shared_prefix: bool = False
    moe_routing_shared_fresh: float | None = None
    moe_routing_shared_cap: int | None = None
    fast_forward: bool = True
    decode_programs: bool = True
    decode_programs_baseline: str = "none"
    prefill_programs: bool = False
    prefill_cached_kv: bool = False
    decode_merge: bool = False
    repeated_reads: str = "additive"
    fleet_intake: bool = False
    idle_start: bool | None = False
    kv_scatter: bool = False
    plan_after_launches: bool = False
    host_scale: float = 1.0
    device_scale: float = 1.0
    host_jitter: float = 0.0
    loop_s: float = 0.0
    loop_per_seq_s: float = 0.0
    launch_line_grid: str | None = None
    power_curve: str | None = None
    profile_hardware: HardwareSpec | None = None

    def __post_init__(self) -> None:
        COST_MODELS.check(self.cost_model)
        if self.cost_model == "profiled" and not self.profile_path:
            raise ValueError("SimConfig.profile_path must name a step-timing CSV when cost_model='profiled'")
        tp = self.execution.tensor_parallel_size if isinstance(self.execution, ExecutionConfig) else None
        if self.profile_tp_size not in (None, 1, tp):
            raise ValueError(f"SimConfig.profile_tp_size must be None, 1 or execution.tensor_parallel_size ({tp}): "
                             f"a profile is transferred from TP=1 only, got {self.profile_tp_size!r}")
        for name, low in (("activation_reserve_bytes", 0), ("vocab_size", 2), ("eos_token_id", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"SimConfig.{name} must be None or an int >= {low}, got {value!r}")
        skew = self.moe_routing_skew
        if isinstance(skew, bool) or not isinstance(skew, (int, float)) or not 0.0 <= skew <= MAX_SKEW:
            raise ValueError(f"SimConfig.moe_routing_skew must be a number in [0, {MAX_SKEW}] (0: uniform routing), "
                             f"got {skew!r}")
        check_locality(self.moe_routing_locality, "SimConfig.moe_routing_locality")
        if not isinstance(self.moe_routing_shared_prefix, bool):
            raise ValueError(f"SimConfig.moe_routing_shared_prefix must be true or false, "
                             f"got {self.moe_routing_shared_prefix!r}")
        try:
            check_shared(self.moe_routing_shared_fresh, self.moe_routing_shared_cap)
        except ValueError as error:
            raise ValueError(f"SimConfig.{error}") from None
        if not self.moe_routing_shared_prefix and self.moe_routing_shared_fresh is not None:
            raise ValueError("SimConfig.moe_routing_shared_fresh prices routing groups: it needs "
                             "moe_routing_shared_prefix=true")
        if self.idle_start is not None and not isinstance(self.idle_start, bool):
            raise ValueError(f"SimConfig.idle_start must be true, false or null (where measured), "
                             f"got {self.idle_start!r}")
        for name in ("fast_forward", "decode_programs", "prefill_programs", "prefill_cached_kv", "decode_merge",
                     "fleet_intake", "kv_scatter", "plan_after_launches"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SimConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.prefill_cached_kv and not self.prefill_programs:
            raise ValueError("SimConfig.prefill_cached_kv is fitted beside the prefill program term: it needs "
                             "prefill_programs=true")
        if self.decode_programs_baseline not in DECODE_PROGRAMS_BASELINES:
            raise ValueError(f"SimConfig.decode_programs_baseline must be one of {list(DECODE_PROGRAMS_BASELINES)}, "
                             f"got {self.decode_programs_baseline!r}")
        check_rule(self.repeated_reads, "SimConfig.repeated_reads")
        check_host_scale(self.host_scale, "SimConfig.host_scale")
        check_device_scale(self.device_scale, "SimConfig.device_scale")
        if self.device_scale != 1.0 and self.cost_model != "profiled":
            raise ValueError(f"SimConfig.device_scale prices a profiled model's device work: it needs "
                             f"cost_model=profiled, got {self.cost_model!r} (the roofline takes another GPU "
                             f"through hardware=)")
        check_host_jitter(self.host_jitter, "SimConfig.host_jitter")
        self._check_loop()
        if self.profile_hardware is not None and not isinstance(self.profile_hardware, HardwareSpec):
            raise TypeError(f"SimConfig.profile_hardware must be a HardwareSpec or None, "
                            f"got {type(self.profile_hardware).__name__}")
        if not isinstance(self.execution, ExecutionConfig):
            raise TypeError(f"SimConfig.execution must be an ExecutionConfig, got {type(self.execution).__name__}")

    def _check_loop(self) -> None:
        """loop_s and loop_per_seq_s: numbers >= 0, priced by the profiled cost model at its own TP
        size only (the TP transfer prices its steps by a rule of its own, sim.tp_transfer)."""
        for name in ("loop_s", "loop_per_seq_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"SimConfig.{name} must be a number of seconds in [0, 1) (the serving loop's own "
                                 f"work between submits at the profile's host; 0: not priced), got {value!r}")
        if (self.loop_s or self.loop_per_seq_s) and (self.cost_model != "profiled" or self.transfers_tp):
            raise ValueError("SimConfig.loop_s / loop_per_seq_s price an overlapped step's host work: they need "
                             "cost_model=profiled at the profile's own TP size")
        if self.power_curve is not None and (self.cost_model != "profiled" or self.transfers_tp):
            raise ValueError("SimConfig.power_curve scales the profiled model's device work as one GPU measured it: "
                             "it needs cost_model=profiled at the profile's own TP size")
        if self.launch_line_grid is not None and (self.cost_model != "profiled" or self.transfers_tp):
            raise ValueError("SimConfig.launch_line_grid prices the profiled model's decode graph launches: it needs "
                             "cost_model=profiled at the profile's own TP size")

    @property
    def transfers_tp(self) -> bool:
        """A TP=1 profile priced at tensor_parallel_size > 1 (sim.tp_transfer)."""
        return (self.cost_model == "profiled" and self.profile_tp_size == 1
                and self.execution.tensor_parallel_size > 1)
