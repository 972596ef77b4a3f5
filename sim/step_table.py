"""Step-timing tables (the profiler's rows, a run's recorded steps): checked, completed with the
columns older tables lack, and each row's executor regime (sim.profiled prices each regime with
its own fit)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.features import MOE_FEATURES, REPEATED_FEATURES, attention_pairs

REQUIRED_COLUMNS = ("num_prefill_tokens", "num_decode_tokens", "num_seqs", "prefill_context_tokens",
                    "decode_context_tokens", "duration_s")


def table_regimes(df: pd.DataFrame) -> pd.Series:
    """_regime of every row of a step-timing table, vectorised (tables of real runs have 10^5 rows)."""
    df = complete_columns(df)
    prefill = df["num_prefill_tokens"].to_numpy() > 0
    graph = df["cuda_graph"].to_numpy().astype(bool)
    kind = np.where(prefill, np.where(graph, "prefill_graph", "prefill"),
                    np.where(graph, "decode_graph", "decode_eager"))
    return pd.Series(kind, index=df.index)


def complete_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Check a step-timing table and derive the optional columns (cuda_graph, graph_batch_size, ...)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"step-timing table lacks columns {missing}; write rows with sim.features.step_features")
    df = df.copy()
    if "num_tokens" not in df:
        df["num_tokens"] = df["num_prefill_tokens"] + df["num_decode_tokens"]
    if "cuda_graph" not in df:
        df["cuda_graph"] = 0
    df["cuda_graph"] = df["cuda_graph"].astype(int)
    if "graph_batch_size" not in df:
        df["graph_batch_size"] = df["num_seqs"]
    # tables (or rows, when tables are stacked) written before the column existed sampled without seeds
    df["num_seeded"] = df["num_seeded"].fillna(0).astype(int) if "num_seeded" in df else 0
    # ... and counted no repeated reads (steps that had some were priced as first reads)
    for column in REPEATED_FEATURES:
        df[column] = df[column].fillna(0).astype(int) if column in df else 0
    for column in MOE_FEATURES:  # stacked tables: rows of a dense run have none
        if column in df:
            df[column] = df[column].fillna(0.0)
    if "prefill_attention_pairs" not in df:
        # Exact only for one prefill chunk per step: n tokens after c cached ones.
        chunks = df["num_seqs"] - df["num_decode_tokens"]
        if (chunks > 1).any():
            raise ValueError("step-timing table lacks prefill_attention_pairs and has steps with several prefill "
                             "chunks, where it cannot be derived; write rows with sim.features.step_features")
        n, c = df["num_prefill_tokens"], df["prefill_context_tokens"]
        df["prefill_attention_pairs"] = attention_pairs(n, c)
    return df
