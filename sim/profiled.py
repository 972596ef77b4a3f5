"""Profiled cost model: step times fitted to the engine's measured steps.

Steps fall in four regimes that a GPU runs differently, each fitted on its own rows:
- "prefill" (any prefill chunk, mixed steps included, run eagerly): piecewise-linear in num_tokens
  (memory-bound for small chunks, compute-bound for large ones) + attention pairs + decode context
  + sequences + repeated reads;
- "prefill_graph" (the same, replayed as a CUDA graph): the same fit in the padded token count,
  priced by the device-time fit where the profile has one (DEVICE_PRICED_REGIMES says why);
- "decode_graph" (decode-only, replayed CUDA graph): piecewise-linear in the padded graph batch,
  whose cost steps with the captured sizes, + decode context tokens (KV reads) + those read again
  (a shared prefix's blocks, from L2: a saving per token; sim.repeated_reads);
- "decode_eager": the same in the real batch size.
Inside the measured range a prediction interpolates; outside it extrapolates the nearest segment
and warns (ExtrapolationWarning), once per model instance and feature.

Host time: duration_s in a step-timing table is what the executor measured for execute(); on a
wall clock the loop also spends time between steps (the scheduler's schedule() and update(),
admissions). Where a table has a host_s column (real engine runs recorded by the harness), a
fourth fit, "host", prices that time (linear in num_seqs and prefill tokens, plain least squares:
the clock needs its mean; stalls above HOST_STALL_S are left out), and step_time() adds it, so the
simulated clock follows the engine's wall clock. predict() of a table stays comparable with its
duration_s, the executor's part (gpu_s for device-priced rows: priced_measurement).

Mixture-of-experts models: a profile whose rows carry sim.features.MOE_FEATURES (distinct experts
touched per MoE layer) adds them to every regime's linear features where the rows separate them
from the size (else the knots absorb them: sim.piecewise.collinear), so a fit learns the price of an
expert's weights apart from the batch's other work; the model then prices a simulated step with the
expected count (distinct_experts, set from the routing by sim.cost_model), a decode step no lower
than its weight reads (floor: sim.moe.WeightReadFloor). Dense profiles lack the column and fit
exactly as before.

Overlapped steps (async scheduling): where the profile measured each step's launches and device
time apart, an eager or prefill graph step is priced behind the step before it
(sim.profiled_overlap says how); predict() does the same for a table in step order.

Another GPU of the same kind: device_scale (sim.device_speed) prices every step's device work, its
fitted duration and its device time alone, that many times the profile's; the host parts keep
theirs (the host's speed is host_scale's, sim.host_speed).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.graph_sizes import GraphSizes
from engine.core.plan import StepPlan
from sim.decode_merge import prices_merge, with_decode_merge, with_row_merge
from sim.decode_programs import PROGRAM_EXCESS, DecodePrograms
from sim.features import MOE_FEATURES, DistinctExperts, as_graph_sizes, step_features
from sim.host_draws import host_draw
from sim.overlapped_reads import OverlappedReads
from sim.piecewise import PiecewiseLinearFit
from sim.prefill_programs import PREFILL_CACHED_KV_BYTES, PREFILL_TERMS, PrefillPrograms
from sim.profiled_features import programs_if_used, with_prefill_programs, with_program_excess, with_row_programs
from sim.profiled_overlap import overlapped_duration
from sim.profiled_regimes import (
    COEFFICIENT_COLUMNS,
    DECODE_REGIMES,
    DEVICE_PRICED_REGIMES,
    EAGER_REGIMES,
    FALLBACK,
    HOST_PARTS,
    HOST_REGIME,
    HOST_STALL_S,
    MIN_DURATION_S,
    OVERLAP_REGIMES,
    REGIMES,
    REQUIRED_OVERLAP_PARTS,
    SPEED_PARTS,
    as_regime,
    coefficient_rows,
    fit_regimes,
    fits_from_table,
    regime_of,
)
from sim.profiled_table import predict_table
from sim.step_table import complete_columns, table_regimes

# the regimes' names and rules are sim.profiled_regimes'; re-exported for the modules that price
# with this model
__all__ = ["DECODE_REGIMES", "DEVICE_PRICED_REGIMES", "EAGER_REGIMES", "HOST_PARTS", "HOST_REGIME", "HOST_STALL_S",
           "OVERLAP_REGIMES", "REGIMES", "REQUIRED_OVERLAP_PARTS", "SPEED_PARTS", "ExtrapolationWarning",
           "ProfiledCostModel", "complete_columns", "table_regimes"]


class ExtrapolationWarning(UserWarning):
    """A step is priced outside the range of the profile it was fitted on."""


class ProfiledCostModel:
    def __init__(self, fits: Mapping[str, PiecewiseLinearFit], graphs: GraphSizes | Sequence[int] = ()) -> None:
        unknown = set(fits) - set(REGIMES) - {HOST_REGIME} - set(OVERLAP_REGIMES)
        if unknown:
            raise ValueError(f"unknown regimes {sorted(unknown)}; known: {sorted(REGIMES)}")
        if "prefill" not in fits and "prefill_graph" not in fits:
            raise ValueError(
                "a profiled cost model needs prefill steps in its profile (regime 'prefill' or 'prefill_graph')")
        self.fits = dict(fits)
        # whether a decode fit prices the merge of split partials (sim.decode_merge): read on every
        # priced step, so once here (a model's fits are not changed after it is made)
        self.prices_merge = prices_merge(self.fits)
        self.graphs = as_graph_sizes(graphs)  # which steps the engine replays as CUDA graphs
        self._warned: set[tuple[str, str]] = set()
        # the previous priced step, for overlap: its duration and its own launch time
        self._previous: tuple[float, float] | None = None
        # the last priced step's launches (host time of its submit()), which the loop waits for
        # before it plans the next step (sim.executor)
        self.last_launch_s = 0.0
        self.launch_delay_s = 0.0  # the loop's work before a launch (sim.profiled_overlap)
        # the serving loop's own host work between overlapped submits, per step and per running
        # sequence, at this model's host (sim.profiled_overlap; SimConfig.loop_s): 0, not priced
        self.loop_s = 0.0
        self.loop_per_seq_s = 0.0
        # the serving host's speed against the profile's (sim.host_speed): 1 prices the host parts
        # as the profile measured them
        self.host_scale = 1.0
        # the serving GPU's step time against the profile's GPU (sim.device_speed): 1 prices the
        # device work as the profile measured it
        self.device_scale = 1.0
        # the next step's device work against the profile's on a GPU at its power limit, set by the
        # executor before it prices the step (sim.power_limit; 1 outside)
        self.power_scale = 1.0
        # the host's speed drawn anew each step, exp(N(0, host_jitter)), from (host_seed, step)
        # (sim.host_speed); _host_draw is the step being priced's draw (1 outside _price)
        self.host_jitter = 0.0
        self.host_seed = 0
        self._host_draw = 1.0
        # (predicted - measured) / measured of steps the fit never saw (harness.calibration.fit.validate):
        # what sim.interval resamples for a prediction interval
        self.residuals: tuple[float, ...] = ()
        # an MoE model's distinct experts per step size (sim.features.MOE_FEATURES); the cost model's
        # builder sets it from the model's routing (sim.cost_model)
        self.distinct_experts: DistinctExperts | None = None
        # sequences over one cached prefix priced as one routing sequence (sim.features.routing_sequences)
        self.shared_prefix_routing = False
        # the least time a decode step can take (sim.moe.WeightReadFloor for an MoE model; None: none)
        self.floor: Callable[[Mapping[str, float]], float] | None = None
        # the engine's decode kernel, whose longest programs a decode step waits on (None: the
        # step's KV read priced by its total context alone)
        self.decode_programs: DecodePrograms | None = None
        # repeated KV reads priced as overlapping the first reads (sim.overlapped_reads; None: each
        # fit's linear price of them, sim.repeated_reads)
        self.overlapped_reads: OverlappedReads | None = None
        # the engine's prefill kernel, whose longest programs a prefill step waits on, where the
        # profile was fitted with them (sim.prefill_programs; uses_prefill_programs)
        self.prefill_programs: PrefillPrograms | None = None
        # the engine's decode kernel, whose merge of split partials a fit fitted with it prices
        # (sim.decode_merge; prices_merge)
        self.merge_programs: DecodePrograms | None = None

    @property
    def uses_prefill_programs(self) -> bool:
        """Whether a fit prices the prefill kernel's program term or the cached context's K/V bytes
        (fitted with PrefillPrograms)."""
        return any(term in fit.linear_features for fit in self.fits.values() for term in PREFILL_TERMS)

    @property
    def uses_cached_kv(self) -> bool:
        """Whether a fit prices the cached context's K/V bytes (sim.prefill_programs, cached_kv)."""
        return any(PREFILL_CACHED_KV_BYTES in fit.linear_features for fit in self.fits.values())

    @property
    def uses_moe_features(self) -> bool:
        """Whether a fit prices the MoE columns (a profile of an MoE model)."""
        return any(name in MOE_FEATURES for fit in self.fits.values() for name, _, _ in fit.ranges)

    # ---- fitting and persistence --------------------------------------------------------------

    @classmethod
    def fit(cls, df: pd.DataFrame, graphs: GraphSizes | Sequence[int] = (), max_knots: int = 40,
            min_support: int = 3, prefill_programs: PrefillPrograms | None = None,
            decode_merge: DecodePrograms | None = None) -> ProfiledCostModel:
        """Fit on a step-timing table (columns: sim.features.FEATURE_COLUMNS and duration_s); with
        prefill_programs, the prefill fits take the kernel's program term (sim.prefill_programs); with
        decode_merge, the decode fits the merge of split partials (sim.decode_merge)."""
        sizes = as_graph_sizes(graphs)
        merge = None if decode_merge is None else (decode_merge, sizes.decode_context)
        model = cls(fit_regimes(df, max_knots, min_support, prefill_programs, merge), sizes)
        model.prefill_programs = prefill_programs
        model.merge_programs = decode_merge if model.prices_merge else None
        return model

    def to_csv(self, path: str | Path) -> None:
        """Save the fitted coefficients (long format: regime, kind, name, x, value)."""
        rows = coefficient_rows(self.fits)
        if self.prices_overlap:
            rows.append(("overlap", "constant", "launch_delay_s", 0.0, self.launch_delay_s))
        rows += [("residual", "residual", "rel_error", float(i), r) for i, r in enumerate(self.residuals)]
        pd.DataFrame(rows, columns=COEFFICIENT_COLUMNS).to_csv(path, index=False)

    @classmethod
    def load(cls, path: str | Path, graphs: GraphSizes | Sequence[int] = (),
             prefill_programs: PrefillPrograms | None = None, fit_programs: bool = True,
             decode_merge: DecodePrograms | None = None) -> ProfiledCostModel:
        """Read either saved coefficients (to_csv) or a measured step-timing table (fitted now, with
        prefill_programs' term where given and fit_programs). Saved coefficients fitted with the
        term price it with prefill_programs (required then: ValueError without)."""
        try:
            df = pd.read_csv(path)
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
            raise ValueError(f"{path}: not a readable CSV file ({str(error).strip()})") from None
        if "duration_s" in df.columns:
            return cls.fit(df, graphs, prefill_programs=prefill_programs if fit_programs else None,
                           decode_merge=decode_merge)
        if not set(COEFFICIENT_COLUMNS) <= set(df.columns):
            raise ValueError(f"{path}: neither a step-timing table (needs duration_s) nor saved coefficients "
                             "(needs regime, kind, name, x, value)")
        fits, residuals, constants = fits_from_table(df)
        model = cls(fits, graphs)
        model.prefill_programs = programs_if_used(model.uses_prefill_programs, prefill_programs, str(path),
                                                  model.uses_cached_kv)
        model.residuals = residuals
        if "launch_delay_s" in constants:
            model.launch_delay_s = constants["launch_delay_s"]
        return model

    # ---- prediction -----------------------------------------------------------------------------

    @property
    def has_host(self) -> bool:
        return HOST_REGIME in self.fits

    @property
    def prices_lead(self) -> bool:
        """Whether a fit prices a step's lead after an idle gap (sim.profiled_overlap)."""
        return any(name.startswith("lead:") for name in self.fits)

    @property
    def prices_overlap(self) -> bool:
        return all(f"{part}:prefill" in self.fits or f"{part}:prefill_graph" in self.fits
                   for part in REQUIRED_OVERLAP_PARTS)

    def step_time(self, plan: StepPlan) -> float:
        features = step_features(plan, self.graphs, self.distinct_experts, self.shared_prefix_routing)
        return self._price(self._with_programs(features, plan, 0), plan.stats.step)

    def decode_repeats(self, plan: StepPlan) -> Iterator[float]:
        """step_time() of plan's repeats (a decode step; engine.core.fast_forward), each with every
        context j tokens longer, j = 1, 2, ...: only decode_context_tokens changes."""
        features = step_features(plan, self.graphs, self.distinct_experts, self.shared_prefix_routing)
        context = features["decode_context_tokens"]
        num_seqs = features["num_seqs"]
        for j in itertools.count(1):
            step = {**features, "decode_context_tokens": context + j * num_seqs}
            yield self._price(self._with_programs(step, plan, j), plan.stats.step + j)

    def _with_programs(self, features: dict[str, float], plan: StepPlan, ahead: int) -> dict[str, float]:
        if self.prefill_programs is not None and self.uses_prefill_programs:
            features = with_prefill_programs(features, plan, self.prefill_programs)
        if self.merge_programs is not None:
            features = with_decode_merge(features, plan, ahead, self.merge_programs, self.graphs)
        return with_program_excess(features, plan, ahead, self.decode_programs, self.fits, self.graphs)

    def _price(self, features: dict[str, float], step: int) -> float:
        if self.host_jitter:
            self._host_draw = host_draw(self.host_seed, step, self.host_jitter)
        duration = self.predict_features(features)
        if self.prices_overlap:
            # step 0 is a new run's first step (a fresh scheduler): nothing before it to hide behind
            duration = self.overlapped(features, duration, self._previous if step else None)
            self.last_launch_s = self._part("launch", features)
            self._previous = (duration, self.last_launch_s + self.loop_time(features))
        if not self.host_jitter:
            return duration + self.host_time(features)
        seconds = duration + self.host_time(features)
        self._host_draw = 1.0
        return seconds

    def drained(self) -> None:
        """The next step has no predecessor in flight to hide its launches behind (sim.cost_model):
        after an idle gap a bursty arrival's first step pays its whole launch time."""
        self._previous = None

    def overlapped(self, features: Mapping[str, float], duration: float,
                   previous: tuple[float, float] | None) -> float:
        """A prefill or eager step, from the previous step's end on the device to its own end,
        behind previous (its duration and launch time; None: nothing in flight):
        sim.profiled_overlap.overlapped_duration."""
        other_host = self.host_scale != 1.0 or bool(self.host_jitter)
        return overlapped_duration(regime_of(features), duration, lambda part: self._part(part, features),
                                   previous, self.launch_delay_s, other_host, self.loop_time(features))

    def loop_time(self, features: Mapping[str, float]) -> float:
        """The serving loop's own host work before the step's submit: loop_s + loop_per_seq_s x its
        sequences (already at this model's host: sim.host_speed scales them as the launches), times
        the step's host draw (host_jitter); 0 where not priced."""
        if not (self.loop_s or self.loop_per_seq_s):
            return 0.0
        return (self.loop_s + self.loop_per_seq_s * features.get("num_seqs", 0.0)) * self._host_draw

    def overlap_parts(self, features: Mapping[str, float]) -> tuple[float, float]:
        """(launch_s, gpu_s) of the step's regime: the host time of submit() and the device time
        alone; (0, 0) where the profile did not measure them (not an overlapping profile)."""
        return self._part("launch", features), self._part("gpu", features)

    def _part(self, part: str, features: Mapping[str, float]) -> float:
        regime = regime_of(features)
        name = f"{part}:{regime}"
        fit = self.fits.get(name)
        if fit is None:
            return 0.0
        features = self._row_terms(features)
        value = max(fit.predict(features) - self._read_saving(name, fit, features), 0.0)
        if part == "gpu":
            return value * self.device_scale * self.power_scale
        return value * self._host_draw if self._host_draw != 1.0 and part in SPEED_PARTS else value

    def host_time(self, features: Mapping[str, float]) -> float:
        """Wall time the loop spends around the step (0 when the profile has no host_s)."""
        fit = self.fits.get(HOST_REGIME)
        if fit is None:
            return 0.0
        for name, value, lo, hi in fit.out_of_range(features):
            self._warn_once(HOST_REGIME, name, f"host time of a step with {name}={value:g} outside the "
                                               f"profiled range [{lo:g}, {hi:g}]; extrapolating")
        value = max(fit.predict(features), 0.0)
        return value * self._host_draw if self._host_draw != 1.0 else value

    def predict_features(self, features: Mapping[str, float]) -> float:
        """The executor's part of the step (comparable with a table's duration_s); a step's features
        without the prefill program term the profile prices take it from their totals
        (sim.profiled_features.with_row_programs)."""
        features = self._row_terms(features)
        regime = regime_of(features)
        used = next(r for r in FALLBACK[regime] if r in self.fits)
        if used != regime:
            self._warn_once(regime, "regime", f"no {regime!r} steps were profiled; pricing them as {used!r}")
            features = as_regime(features, regime, used)
        fit = self.fits[used]
        for name, value, lo, hi in fit.out_of_range(features):
            self._warn_once(used, name, f"{used} step has {name}={value:g} outside the profiled range "
                                        f"[{lo:g}, {hi:g}]; extrapolating")
        floor = MIN_DURATION_S
        if self.floor is not None and regime in DECODE_REGIMES:
            floor = max(self.floor(features), floor)
        return max(fit.predict(features) - self._read_saving(used, fit, features) + features.get(PROGRAM_EXCESS, 0.0),
                   floor) * self.device_scale * self.power_scale

    def _row_terms(self, features: Mapping[str, float]) -> Mapping[str, float]:
        """features with the kernel terms the fits price, from the step's totals where it lacks them
        (a table's row, a tool's own step: sim.profiled_features.with_row_programs, sim.decode_merge)."""
        features = with_row_programs(features, self.fits, self.prefill_programs)
        if self.prices_merge:
            features = with_row_merge(features, self.merge_programs, self.graphs.decode_context)
        return features

    def _read_saving(self, name: str, fit: PiecewiseLinearFit, features: Mapping[str, float]) -> float:
        """What the step's repeated reads save under the overlap rule (0 without it)."""
        return 0.0 if self.overlapped_reads is None else self.overlapped_reads.saving_s(name, fit, features)

    def predict(self, df: pd.DataFrame, include_host: bool = False) -> np.ndarray:
        """Predicted duration_s for each row of a step-timing table (sim.profiled_table.predict_table)."""
        return predict_table(self, df, include_host)

    def _warn_once(self, regime: str, name: str, message: str) -> None:
        if (regime, name) not in self._warned:
            self._warned.add((regime, name))
            warnings.warn(message, ExtrapolationWarning, stacklevel=3)
