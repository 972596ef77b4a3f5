"""How steep each server's client TTFT distribution is around its median, in a served benchmark.

    python -m experiments.serve.ttft_band OUT [--cases mooncake_50]

OUT: bench_serve's --out folder (engine_server.tar.gz and sim_server.tar.gz, or the folders they
pack). Per case and server: the client TTFT at P40, P45, P50, P55 and P60 and its mean (ms), and
`band_pct`, the P45-P55 span over P50. Where a case's prompts fall into size classes (Mooncake's
clipped at max_model_len beside short ones), the median can sit in the gap between two classes'
TTFTs: a few requests crossing it move the P50 by the band, while the mean stays put. A P50 miss
smaller than the band cannot be told from which side of the gap the middle request landed.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve.split_inputs import SERVERS, unpack
from experiments.serve.ttft_split import client_records
from harness.compare.tables import markdown

QUANTILES = (40, 45, 50, 55, 60)


def band_row(case: str, server: str, ttft_s: np.ndarray) -> dict:
    """The TTFT quantiles (ms) of one case's requests on one server, their mean and band_pct."""
    ms = ttft_s[np.isfinite(ttft_s)] * 1e3
    if ms.size == 0:
        raise SystemExit(f"error: {server} has no TTFT for {case}")
    at = dict(zip(QUANTILES, np.percentile(ms, QUANTILES)))
    return {"case": case, "server": server, "requests": int(ms.size),
            **{f"ttft_p{q}_ms": round(float(v), 2) for q, v in at.items()},
            "ttft_mean_ms": round(float(ms.mean()), 2), "band_pct": round(100 * (at[55] - at[45]) / at[50], 1)}


def bands(folders: dict[str, Path], cases: list[str] | None) -> pd.DataFrame:
    """One band_row per case (aiperf_<case> folders of the engine server) and server."""
    found = sorted(p.name.removeprefix("aiperf_") for p in folders["engine_server"].glob("aiperf_*") if p.is_dir())
    chosen = found if cases is None else cases
    missing = sorted(set(chosen) - set(found))
    if missing:
        raise SystemExit(f"error: no aiperf records for {missing} (cases: {found})")
    return pd.DataFrame([band_row(case, server, client_records(folder, case)["ttft_s"].to_numpy(float))
                         for case in chosen for server, folder in folders.items()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="bench_serve's --out folder")
    parser.add_argument("--cases", type=lambda s: s.split(","), default=None, help="cases (default: every case)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        table = bands(unpack(args.out, Path(tmp), stages=SERVERS), args.cases)
    print(markdown(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
