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

Overlapped steps (async scheduling): the engine launches step N+1 from the host while the device
still runs step N, so an eager step whose launches take longer than its device work (a small
prefill: ~20 ms of Python launches for Qwen3-0.6B against ~2 ms of kernels) is partly hidden
behind the step before it. A profile of an overlapping engine (harness.calibration.profiling) measures, per
shape, launch_s (host time of submit()) and gpu_s (device time alone), and a real run records
launch_s of every step; then two more fits per regime, "launch:<regime>" and "gpu:<regime>", and
step_time() prices an eager step as max(gpu + max(0, lead - free), launch - free) and a prefill
graph step as gpu + max(0, lead - free), where free is the host time left free during the
previous step (its priced duration less its own launch time less launch_delay_s, the loop's own
work before it launches the next step: reading the previous result, update(), schedule(),
building the batch; fitted on real steps, harness.calibration.fit; 0 with nothing in flight) and
lead, a third fit ("lead:<regime>", from the profile's lead_s), the host time from submit() until
the device can run the step without waiting, measured as the time from submit() on an idle device
until the device finished the step, less its device time. A step after an idle gap pays its whole
lead; one behind a long step pays none. predict() does the same for a table in step order with its previous_duration_s
column (the measured duration of each row's predecessor; without it a row is priced as the grid
measured it, behind a repeat of itself).
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
from sim.features import MOE_FEATURES, DistinctExperts, as_graph_sizes, step_features
from sim.piecewise import PiecewiseLinearFit
from sim.step_table import complete_columns, table_regimes

# regime -> (size feature, linear features)
# num_seeded: rows sampled with a per-request seed cost a generator each on the host (a profile
# sampled without seeds leaves the column at 0, and a constant column is not fitted).
REGIMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "prefill": ("num_tokens", ("prefill_attention_pairs", "decode_context_tokens", "decode_repeated_tokens",
                               "prefill_repeated_tokens", "num_seqs", "num_seeded")),
    "prefill_graph": ("graph_batch_size", ("prefill_attention_pairs", "decode_context_tokens", "decode_repeated_tokens",
                                           "prefill_repeated_tokens", "num_seqs", "num_seeded")),
    "decode_graph": ("graph_batch_size", ("decode_context_tokens", "decode_repeated_tokens", "num_seeded")),
    "decode_eager": ("num_seqs", ("decode_context_tokens", "decode_repeated_tokens", "num_seeded")),
}
# Host time between steps: size feature, linear features (see the module docstring).
HOST_REGIME = "host"
HOST_FIT = ("num_seqs", ("num_prefill_tokens",))
HOST_MAX_KNOTS = 2  # linear in num_seqs: the scheduler's work is per request
# A host time above this is a stall (a garbage-collector pause of the Python process: 0.2-0.4 s,
# a few per run), not the step's own work; such rows are left out of the host fit.
HOST_STALL_S = 0.05
# Where a step's own regime was not profiled, the next one that was.
_FALLBACK = {"prefill": ("prefill", "prefill_graph"), "prefill_graph": ("prefill_graph", "prefill"),
             "decode_graph": ("decode_graph", "decode_eager", "prefill", "prefill_graph"),
             "decode_eager": ("decode_eager", "decode_graph", "prefill", "prefill_graph")}
_MIN_DURATION_S = 1e-6
# Overlap fits: "<part>:<regime>" of the columns launch_s, gpu_s and lead_s of an overlapping
# profile. Pricing overlap needs launch and gpu; a profile without lead_s prices no lead.
OVERLAP_PARTS = {"launch": "launch_s", "gpu": "gpu_s", "lead": "lead_s"}
REQUIRED_OVERLAP_PARTS = ("launch", "gpu")
# Parts that are host time (the same on another GPU; no device-side prior applies to them). Lead
# can be zero, so it is fitted to absolute, not relative, error.
HOST_PARTS = ("launch", "lead")
OVERLAP_REGIMES = tuple(f"{part}:{regime}" for part in OVERLAP_PARTS for regime in REGIMES)
EAGER_REGIMES = ("prefill", "decode_eager")
DECODE_REGIMES = ("decode_graph", "decode_eager")
# Graph regimes priced by their device time alone (gpu_s, measured after the device sat idle)
# rather than by the span of back-to-back repeats: repeats of one compute-bound prefill keep the
# device at full power, and its clock drops, while a served prefill runs between decode steps.
# Summed over the prefill graph steps of served online runs on an H100, the span fit priced
# Qwen3-8B's 9-11% above what they took, the device-time fit 3-6%; decode graph steps are the
# other way round (span 0-3% under, device time 1-5% under), so they keep the span
# (experiments/calibration/price_check.py compares the two fits on a run's steps).
DEVICE_PRICED_REGIMES = ("prefill_graph",)


class ExtrapolationWarning(UserWarning):
    """A step is priced outside the range of the profile it was fitted on."""


def _regime(features: Mapping[str, float]) -> str:
    if features["num_prefill_tokens"] > 0:
        return "prefill_graph" if features["cuda_graph"] else "prefill"
    return "decode_graph" if features["cuda_graph"] else "decode_eager"


def _as_regime(features: Mapping[str, float], regime: str, used: str) -> Mapping[str, float]:
    """A step priced by another regime's fit. The two prefill fits differ only in their size (the
    padded token count of a graph, the token count of an eager step): the step brings the tokens
    its GPU really runs to either (an eager step's graph_batch_size is its sequence count)."""
    if {regime, used} != {"prefill", "prefill_graph"}:
        return features
    tokens = features["graph_batch_size"] if regime == "prefill_graph" else features["num_tokens"]
    return {**features, "num_tokens": tokens, "graph_batch_size": tokens}


def _with_moe(rows: pd.DataFrame, linear: tuple[str, ...]) -> tuple[str, ...]:
    """A regime's linear features, plus the MoE columns where the rows have them (an MoE model's
    profile): a dense profile's fits are exactly as they were."""
    return linear + tuple(f for f in MOE_FEATURES if f in rows.columns and rows[f].notna().all())


class ProfiledCostModel:
    def __init__(self, fits: Mapping[str, PiecewiseLinearFit], graphs: GraphSizes | Sequence[int] = ()) -> None:
        unknown = set(fits) - set(REGIMES) - {HOST_REGIME} - set(OVERLAP_REGIMES)
        if unknown:
            raise ValueError(f"unknown regimes {sorted(unknown)}; known: {sorted(REGIMES)}")
        if "prefill" not in fits and "prefill_graph" not in fits:
            raise ValueError(
                "a profiled cost model needs prefill steps in its profile (regime 'prefill' or 'prefill_graph')")
        self.fits = dict(fits)
        self.graphs = as_graph_sizes(graphs)  # which steps the engine replays as CUDA graphs
        self._warned: set[tuple[str, str]] = set()
        # the previous priced step, for overlap: its duration and its own launch time
        self._previous: tuple[float, float] | None = None
        self.launch_delay_s = 0.0  # see the module docstring
        # (predicted - measured) / measured of steps the fit never saw (harness.calibration.fit.validate):
        # what sim.interval resamples for a prediction interval
        self.residuals: tuple[float, ...] = ()
        # an MoE model's distinct experts per step size (sim.features.MOE_FEATURES); the cost model's
        # builder sets it from the model's routing (sim.cost_model)
        self.distinct_experts: DistinctExperts | None = None
        # the least time a decode step can take (sim.moe.WeightReadFloor for an MoE model; None: none)
        self.floor: Callable[[Mapping[str, float]], float] | None = None

    @property
    def uses_moe_features(self) -> bool:
        """Whether a fit prices the MoE columns (a profile of an MoE model)."""
        return any(name in MOE_FEATURES for fit in self.fits.values() for name, _, _ in fit.ranges)

    # ---- fitting and persistence --------------------------------------------------------------

    @classmethod
    def fit(cls, df: pd.DataFrame, graphs: GraphSizes | Sequence[int] = (), max_knots: int = 40,
            min_support: int = 3) -> ProfiledCostModel:
        """Fit on a step-timing table (columns: sim.features.FEATURE_COLUMNS and duration_s)."""
        df = complete_columns(df)
        timed = df[df["duration_s"].notna()]
        regimes = table_regimes(timed)
        fits = {}
        for name, (size, linear) in REGIMES.items():
            rows = timed[regimes == name]
            if len(rows):
                linear = _with_moe(rows, linear)
                fits[name] = PiecewiseLinearFit.fit(rows[size].to_numpy(), {f: rows[f].to_numpy() for f in linear},
                                                    rows["duration_s"].to_numpy(), size, max_knots,
                                                    min_support, unless_collinear=MOE_FEATURES)
        for part, column in OVERLAP_PARTS.items():
            if column not in df.columns:
                continue
            for name, (size, linear) in REGIMES.items():
                rows = df[(table_regimes(df) == name) & df[column].notna()]
                if len(rows):
                    linear = _with_moe(rows, linear)
                    fits[f"{part}:{name}"] = PiecewiseLinearFit.fit(
                        rows[size].to_numpy(), {f: rows[f].to_numpy() for f in linear}, rows[column].to_numpy(),
                        size, max_knots, min_support, relative=part != "lead", unless_collinear=MOE_FEATURES)
        if "host_s" in df.columns and (df["host_s"] <= HOST_STALL_S).any():
            rows = df[df["host_s"] <= HOST_STALL_S]
            size, linear = HOST_FIT
            fits[HOST_REGIME] = PiecewiseLinearFit.fit(rows[size].to_numpy(), {f: rows[f].to_numpy() for f in linear},
                                                       rows["host_s"].to_numpy(), size, HOST_MAX_KNOTS,
                                                       min_support, relative=False)
        return cls(fits, graphs)

    def to_csv(self, path: str | Path) -> None:
        """Save the fitted coefficients (long format: regime, kind, name, x, value)."""
        rows = []
        for regime, fit in self.fits.items():
            rows += [(regime, "knot", fit.size_feature, k, v) for k, v in zip(fit.knots, fit.knot_values)]
            rows += [(regime, "linear", f, 0.0, c) for f, c in zip(fit.linear_features, fit.linear_coefs)]
            rows += [(regime, "range", f, lo, hi) for f, lo, hi in fit.ranges]
        if self.prices_overlap:
            rows.append(("overlap", "constant", "launch_delay_s", 0.0, self.launch_delay_s))
        rows += [("residual", "residual", "rel_error", float(i), r) for i, r in enumerate(self.residuals)]
        pd.DataFrame(rows, columns=["regime", "kind", "name", "x", "value"]).to_csv(path, index=False)

    @classmethod
    def load(cls, path: str | Path, graphs: GraphSizes | Sequence[int] = ()) -> ProfiledCostModel:
        """Read either saved coefficients (to_csv) or a measured step-timing table (fitted now)."""
        try:
            df = pd.read_csv(path)
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
            raise ValueError(f"{path}: not a readable CSV file ({str(error).strip()})") from None
        if "duration_s" in df.columns:
            return cls.fit(df, graphs)
        if not {"regime", "kind", "name", "x", "value"} <= set(df.columns):
            raise ValueError(f"{path}: neither a step-timing table (needs duration_s) nor saved coefficients "
                             "(needs regime, kind, name, x, value)")
        fits = {}
        constants = df[df["kind"] == "constant"]
        residuals = df.loc[df["kind"] == "residual", "value"]
        df = df[~df["kind"].isin(("constant", "residual"))]
        for regime, part in df.groupby("regime", sort=False):
            knots = part[part["kind"] == "knot"]
            linear = part[part["kind"] == "linear"]
            ranges = part[part["kind"] == "range"]
            fits[regime] = PiecewiseLinearFit(
                str(knots["name"].iloc[0]), tuple(knots["x"]), tuple(knots["value"]), tuple(linear["name"]),
                tuple(linear["value"]), tuple(zip(ranges["name"], ranges["x"], ranges["value"])))
        model = cls(fits, graphs)
        model.residuals = tuple(map(float, residuals))
        for _, row in constants.iterrows():
            if row["name"] == "launch_delay_s":
                model.launch_delay_s = float(row["value"])
        return model

    # ---- prediction -----------------------------------------------------------------------------

    @property
    def has_host(self) -> bool:
        return HOST_REGIME in self.fits

    @property
    def prices_overlap(self) -> bool:
        return all(f"{part}:prefill" in self.fits or f"{part}:prefill_graph" in self.fits
                   for part in REQUIRED_OVERLAP_PARTS)

    def step_time(self, plan: StepPlan) -> float:
        return self._price(step_features(plan, self.graphs, self.distinct_experts), plan.stats.step)

    def decode_repeats(self, plan: StepPlan) -> Iterator[float]:
        """step_time() of plan's repeats (a decode step; engine.core.fast_forward), each with every
        context j tokens longer, j = 1, 2, ...: only decode_context_tokens changes."""
        features = step_features(plan, self.graphs, self.distinct_experts)
        context = features["decode_context_tokens"]
        num_seqs = features["num_seqs"]
        for j in itertools.count(1):
            yield self._price({**features, "decode_context_tokens": context + j * num_seqs}, plan.stats.step + j)

    def _price(self, features: dict[str, float], step: int) -> float:
        duration = self.predict_features(features)
        if self.prices_overlap:
            # step 0 is a new run's first step (a fresh scheduler): nothing before it to hide behind
            duration = self.overlapped(features, duration, self._previous if step else None)
            self._previous = (duration, self._part("launch", features))
        return duration + self.host_time(features)

    def drained(self) -> None:
        """The next step has no predecessor in flight to hide its launches behind (sim.cost_model):
        after an idle gap a bursty arrival's first step pays its whole launch time."""
        self._previous = None

    def overlapped(self, features: Mapping[str, float], duration: float,
                   previous: tuple[float, float] | None) -> float:
        """A prefill or eager step, from the previous step's end on the device to its own end.

        The host starts submitting it `free` seconds before the device is done with the previous
        step (that step's duration less its own launch time and the loop's launch_delay_s; 0 with
        nothing in flight). Its device work cannot start before its lead (host time from submit()
        until the device can run it without waiting: the batch built and uploaded, the first
        launches ahead) nor end before its launches do:
        max(gpu + max(0, lead - free), launch - free). A prefill graph step is launched in one
        call, so only its lead counts (DEVICE_PRICED_REGIMES). Decode graph steps keep the grid's
        duration of back-to-back repeats."""
        regime = _regime(features)
        if regime not in DEVICE_PRICED_REGIMES and regime not in EAGER_REGIMES:
            return duration
        gpu, launch, lead = (self._part(part, features) for part in ("gpu", "launch", "lead"))
        if regime in DEVICE_PRICED_REGIMES and gpu <= 0:
            return duration
        free = 0.0 if previous is None else max(0.0, previous[0] - previous[1] - self.launch_delay_s)
        waited = gpu + max(0.0, lead - free)
        if regime in DEVICE_PRICED_REGIMES:
            return waited
        return max(waited, launch - free, _MIN_DURATION_S)

    def _behind_itself(self, features: Mapping[str, float]) -> tuple[float, float]:
        """(duration, launch) of the step's own predecessor in the grid's back-to-back repeats: with
        its lead hidden, the longer of its device time and its launches."""
        launch = self._part("launch", features)
        return max(self._part("gpu", features), launch), launch

    def overlap_parts(self, features: Mapping[str, float]) -> tuple[float, float]:
        """(launch_s, gpu_s) of the step's regime: the host time of submit() and the device time
        alone; (0, 0) where the profile did not measure them (not an overlapping profile)."""
        return self._part("launch", features), self._part("gpu", features)

    def _part(self, part: str, features: Mapping[str, float]) -> float:
        regime = _regime(features)
        fit = self.fits.get(f"{part}:{regime}")
        return 0.0 if fit is None else max(fit.predict(features), 0.0)

    def host_time(self, features: Mapping[str, float]) -> float:
        """Wall time the loop spends around the step (0 when the profile has no host_s)."""
        fit = self.fits.get(HOST_REGIME)
        if fit is None:
            return 0.0
        for name, value, lo, hi in fit.out_of_range(features):
            self._warn_once(HOST_REGIME, name, f"host time of a step with {name}={value:g} outside the "
                                               f"profiled range [{lo:g}, {hi:g}]; extrapolating")
        return max(fit.predict(features), 0.0)

    def predict_features(self, features: Mapping[str, float]) -> float:
        """The executor's part of the step (comparable with a table's duration_s)."""
        regime = _regime(features)
        used = next(r for r in _FALLBACK[regime] if r in self.fits)
        if used != regime:
            self._warn_once(regime, "regime", f"no {regime!r} steps were profiled; pricing them as {used!r}")
            features = _as_regime(features, regime, used)
        fit = self.fits[used]
        for name, value, lo, hi in fit.out_of_range(features):
            self._warn_once(used, name, f"{used} step has {name}={value:g} outside the profiled range "
                                        f"[{lo:g}, {hi:g}]; extrapolating")
        floor = _MIN_DURATION_S
        if self.floor is not None and regime in DECODE_REGIMES:
            floor = max(self.floor(features), floor)
        return max(fit.predict(features), floor)

    def predict(self, df: pd.DataFrame, include_host: bool = False) -> np.ndarray:
        """Predicted duration_s for each row of a step-timing table; with include_host, plus the
        host time (the whole loop step, what step_time() returns). With a previous_duration_s
        column and an overlapping profile, eager and prefill graph steps are priced after their
        measured predecessor; a row without one as the grid measured it, behind a repeat of itself."""
        df = complete_columns(df.assign(duration_s=1.0)) if "duration_s" not in df else complete_columns(df)
        rows = df.to_dict("records")
        predicted = np.array([self.predict_features(row) for row in rows])
        if self.prices_overlap:
            launches = [self._part("launch", row) for row in rows]
            for i, row in enumerate(rows):
                before = row.get("previous_duration_s", float("nan")) if i else float("nan")
                previous = (before, launches[i - 1]) if before == before else self._behind_itself(row)
                predicted[i] = self.overlapped(row, predicted[i], previous)
        if include_host:
            predicted += np.array([self.host_time(row) for row in rows])
        return predicted

    def _warn_once(self, regime: str, name: str, message: str) -> None:
        if (regime, name) not in self._warned:
            self._warned.add((regime, name))
            warnings.warn(message, ExtrapolationWarning, stacklevel=3)
