"""How well a profiled model prices steps it never saw: the measurement it prices, relative errors
and a random hold-out fit (harness.calibration.fit builds the calibration's validation table on these)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from engine.core.graph_sizes import GraphSizes
from sim.profiled import DEVICE_PRICED_REGIMES, ExtrapolationWarning, ProfiledCostModel
from sim.step_table import complete_columns, table_regimes


def priced_measurement(df: pd.DataFrame) -> np.ndarray:
    """What the model prices of each row of a step-timing table: gpu_s for the device-priced
    regimes where the row has it (a profile of an overlapping engine), else duration_s."""
    measured: np.ndarray = df["duration_s"].to_numpy(dtype=float)
    if "gpu_s" not in df:
        return measured
    gpu: np.ndarray = df["gpu_s"].to_numpy(dtype=float)
    device: np.ndarray = table_regimes(complete_columns(df)).isin(DEVICE_PRICED_REGIMES).to_numpy() & (gpu > 0)
    return np.where(device, gpu, measured)


def relative_errors(model: ProfiledCostModel, df: pd.DataFrame) -> np.ndarray:
    """(predicted - measured) / measured for each row (measured: priced_measurement)."""
    measured = priced_measurement(df)
    predicted: np.ndarray = model.predict(df)
    errors: np.ndarray = (predicted - measured) / measured
    return errors


def holdout_validation(df: pd.DataFrame, test_fraction: float = 0.2, seed: int = 0,
                       graphs: GraphSizes | Sequence[int] = ()) -> tuple[ProfiledCostModel, pd.DataFrame]:
    """Fit on a random (1 - test_fraction) of the rows; return the model and the held-out rows with
    columns predicted_s and rel_error added."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    test = rng.random(len(df)) < test_fraction
    model = ProfiledCostModel.fit(df[~test], graphs)
    held_out = df[test].copy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        held_out["predicted_s"] = model.predict(held_out)
    model._warned.clear()  # the caller's own predictions should still be warned about
    measured = priced_measurement(held_out)
    held_out["rel_error"] = (held_out["predicted_s"] - measured) / measured
    held_out.attrs["extrapolation_warnings"] = [str(w.message) for w in caught]
    return model, held_out
