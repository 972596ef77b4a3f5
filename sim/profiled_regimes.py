"""The regimes of the profiled cost model (sim.profiled): which fit prices a step, the features
each regime is fitted on, fitting them on a step-timing table, and their saved coefficients (long
format: regime, kind, name, x, value)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from sim.decode_merge import merge_column
from sim.decode_programs import DECODE_MERGE_SPLITS, DecodePrograms
from sim.features import MOE_FEATURES
from sim.piecewise import PiecewiseLinearFit
from sim.prefill_programs import PREFILL_CACHED_KV_BYTES, PREFILL_PROGRAM_KEYS, PrefillPrograms
from sim.step_table import complete_columns, table_regimes

# the prefill regimes, whose fits take the prefill kernel's programs where a profile is fitted
# with them (sim.prefill_programs)
PREFILL_REGIMES = ("prefill", "prefill_graph")

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
FALLBACK = {"prefill": ("prefill", "prefill_graph"), "prefill_graph": ("prefill_graph", "prefill"),
             "decode_graph": ("decode_graph", "decode_eager", "prefill", "prefill_graph"),
             "decode_eager": ("decode_eager", "decode_graph", "prefill", "prefill_graph")}
MIN_DURATION_S = 1e-6
# Overlap fits: "<part>:<regime>" of the columns launch_s, gpu_s and lead_s of an overlapping
# profile. Pricing overlap needs launch and gpu; a profile without lead_s prices no lead.
OVERLAP_PARTS = {"launch": "launch_s", "gpu": "gpu_s", "lead": "lead_s"}
REQUIRED_OVERLAP_PARTS = ("launch", "gpu")
# Parts that are host time (the same on another GPU; no device-side prior applies to them). Lead
# can be zero, so it is fitted to absolute, not relative, error.
HOST_PARTS = ("launch", "lead")
# The host parts that follow the serving host's speed (sim.host_speed): the launches. The lead (host
# time until the device can start a step) kept the grid's price on serving hosts whose launches took
# 1.3-2.1x the grid's (experiments/fidelity/cause/host_parts.py), so a host's speed leaves it alone.
SPEED_PARTS = ("launch",)
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


def regime_of(features: Mapping[str, float]) -> str:
    if features["num_prefill_tokens"] > 0:
        return "prefill_graph" if features["cuda_graph"] else "prefill"
    return "decode_graph" if features["cuda_graph"] else "decode_eager"


def as_regime(features: Mapping[str, float], regime: str, used: str) -> Mapping[str, float]:
    """A step priced by another regime's fit. The two prefill fits differ only in their size (the
    padded token count of a graph, the token count of an eager step): the step brings the tokens
    its GPU really runs to either (an eager step's graph_batch_size is its sequence count)."""
    if {regime, used} != {"prefill", "prefill_graph"}:
        return features
    tokens = features["graph_batch_size"] if regime == "prefill_graph" else features["num_tokens"]
    return {**features, "num_tokens": tokens, "graph_batch_size": tokens}


def with_moe(rows: pd.DataFrame, linear: tuple[str, ...]) -> tuple[str, ...]:
    """A regime's linear features, plus the MoE columns where the rows have them (an MoE model's
    profile): a dense profile's fits are exactly as they were."""
    return linear + tuple(f for f in MOE_FEATURES if f in rows.columns and rows[f].notna().all())


def _fit(rows: pd.DataFrame, size: str, linear: tuple[str, ...], target: str, max_knots: int, min_support: int,
         programs: tuple[str, ...], relative: bool = True) -> PiecewiseLinearFit:
    """One regime's (or part's) fit; with programs (PREFILL_PROGRAM_KEYS, and PREFILL_CACHED_KV_BYTES
    where asked), also on those prefill terms (sim.prefill_programs), each kept where the rows give
    it a rate (a coefficient > 0: seconds per key of one program, per byte of cached K and V), the
    others fitted again without it (the rows show no such wait)."""
    def fit(features: tuple[str, ...]) -> PiecewiseLinearFit:
        return PiecewiseLinearFit.fit(rows[size].to_numpy(), {f: rows[f].to_numpy() for f in features},
                                      rows[target].to_numpy(), size, max_knots, min_support, relative=relative,
                                      unless_collinear=MOE_FEATURES)
    terms = programs
    while terms:
        fitted = fit((*linear, *terms))
        rates = dict(zip(fitted.linear_features, fitted.linear_coefs))
        kept = tuple(term for term in terms if rates.get(term, 0.0) > 0)
        if kept == terms:
            return fitted
        terms = kept
    return fit(linear)


def fit_regimes(df: pd.DataFrame, max_knots: int, min_support: int, programs: PrefillPrograms | None = None,
                merge: tuple[DecodePrograms, int] | None = None) -> dict[str, PiecewiseLinearFit]:
    """Every regime's fits on a step-timing table (columns: sim.features.FEATURE_COLUMNS and
    duration_s): each regime's duration, its overlap parts where the table has their columns, and
    the host time where it has host_s. With programs, the prefill regimes' durations and device
    times also fit the prefill kernel's program term (sim.prefill_programs; _fit), and with
    programs.cached_kv the cached context's K/V bytes: columns computed here from each row. With
    merge (the decode kernel and the context its graphs were captured for), the decode regimes'
    durations and device times also fit the merge of split partials (sim.decode_merge)."""
    df = complete_columns(df)
    terms: tuple[str, ...] = ()
    decode_terms: tuple[str, ...] = ()
    records = df.to_dict("records") if programs is not None or merge is not None else []
    if merge is not None:
        df = df.assign(**{DECODE_MERGE_SPLITS: merge_column(records, *merge)})
        decode_terms = (DECODE_MERGE_SPLITS,)
    if programs is not None:
        df = df.assign(**{PREFILL_PROGRAM_KEYS: programs.column(records)})
        terms = (PREFILL_PROGRAM_KEYS,)
        if programs.cached_kv:
            df = df.assign(**{PREFILL_CACHED_KV_BYTES: [programs.cached_kv_bytes(row) for row in records]})
            terms += (PREFILL_CACHED_KV_BYTES,)
    timed = df[df["duration_s"].notna()]
    regimes = table_regimes(timed)
    fits = {}
    for name, (size, linear) in REGIMES.items():
        rows = timed[regimes == name]
        if len(rows):
            fits[name] = _fit(rows, size, with_moe(rows, linear), "duration_s", max_knots, min_support,
                              _terms(name, terms, decode_terms))
    for part, column in OVERLAP_PARTS.items():
        if column not in df.columns:
            continue
        for name, (size, linear) in REGIMES.items():
            rows = df[(table_regimes(df) == name) & df[column].notna()]
            if len(rows):
                # the terms are device time: the host parts (launches, leads) are fitted without them
                device = _terms(name, terms, decode_terms) if part not in HOST_PARTS else ()
                fits[f"{part}:{name}"] = _fit(rows, size, with_moe(rows, linear), column, max_knots, min_support,
                                              device, relative=part != "lead")
    if "host_s" in df.columns and (df["host_s"] <= HOST_STALL_S).any():
        rows = df[df["host_s"] <= HOST_STALL_S]
        size, linear = HOST_FIT
        fits[HOST_REGIME] = PiecewiseLinearFit.fit(rows[size].to_numpy(), {f: rows[f].to_numpy() for f in linear},
                                                   rows["host_s"].to_numpy(), size, HOST_MAX_KNOTS,
                                                   min_support, relative=False)
    return fits


def _terms(regime: str, prefill: tuple[str, ...], decode: tuple[str, ...]) -> tuple[str, ...]:
    """The kernel terms a regime's fits take: the prefill kernel's or the decode kernel's."""
    return prefill if regime in PREFILL_REGIMES else decode if regime in DECODE_REGIMES else ()


COEFFICIENT_COLUMNS = ["regime", "kind", "name", "x", "value"]


def coefficient_rows(fits: Mapping[str, PiecewiseLinearFit]) -> list[tuple[str, str, str, float, float]]:
    """Each fit's knots, linear coefficients and fitted ranges as rows of the saved table."""
    rows = []
    for regime, fit in fits.items():
        rows += [(regime, "knot", fit.size_feature, k, v) for k, v in zip(fit.knots, fit.knot_values)]
        rows += [(regime, "linear", f, 0.0, c) for f, c in zip(fit.linear_features, fit.linear_coefs)]
        rows += [(regime, "range", f, lo, hi) for f, lo, hi in fit.ranges]
    return rows


def fits_from_table(df: pd.DataFrame) -> tuple[dict[str, PiecewiseLinearFit], tuple[float, ...], dict[str, float]]:
    """(fits, residuals, constants by name) of a saved coefficient table."""
    fits = {}
    constants = df[df["kind"] == "constant"]
    residuals = df.loc[df["kind"] == "residual", "value"]
    df = df[~df["kind"].isin(("constant", "residual"))]
    for regime, part in df.groupby("regime", sort=False):
        knots = part[part["kind"] == "knot"]
        linear = part[part["kind"] == "linear"]
        ranges = part[part["kind"] == "range"]
        fits[str(regime)] = PiecewiseLinearFit(
            str(knots["name"].iloc[0]), tuple(knots["x"]), tuple(knots["value"]), tuple(linear["name"]),
            tuple(linear["value"]), tuple(zip(ranges["name"], ranges["x"], ranges["value"])))
    named = {str(name): float(value) for name, value in zip(constants["name"], constants["value"])}
    return fits, tuple(map(float, residuals)), named
