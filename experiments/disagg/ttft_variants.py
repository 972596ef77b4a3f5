"""Whether the disaggregated TTFT misses are priced right once the loaded prefill replica's losses
are: every committed measure call (send_path_choice.CALLS, aggregated cells too) re-simulated with
its engine's own send path (send_path_choice's "engine's own") and

  base          nothing more
  intake        backend.fleet_intake=true (the fleet's request intake, profiles/h200/fleet_intake.json)
  idle          backend.idle_start=true (a step onto an idle device waits the host work before its
                first kernel, hardware.idle_start_host_s)
  intake+idle   both
  fresh         the Qwen3-0.6B calls priced with the fresh H200 grid fit (FRESH, with lead fits;
                the 8B call keeps its own profile: there is no fresh 8B fit)
  fresh+intake
  intake+leads  the 0.6B calls' own profile with FRESH's lead fits added (prefill_whatif.with_leads;
                a diagnostic: those leads were measured on another H200 host)
idle_start is refused beside a profile with lead fits (FRESH, or leads): a lead is timed from
submit() on an idle device, so it holds the anchor and the batch's building already
(ttft_variants.md has what the two combinations gave before that refusal).

    python -m experiments.disagg.ttft_variants [--resim-dir DIR] [--variants V ...] [--out CSV]

DIR keeps each re-simulation (<call>__<variant>.csv, default a scratch folder of the system's
temporary directory); one already there is read, not run again. Writes ttft_variants.csv.gz: per call
and variant, comparisons within target (send_path_choice.count), and ALL rows per variant.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pandas as pd

from experiments.disagg import send_path_choice as spc
from experiments.disagg.h200_run1 import resim
from experiments.disagg.prefill_whatif import with_leads

HERE = Path(__file__).resolve().parent
FRESH = "experiments/fidelity/code_completion_h200_r2/qwen3-0.6b/profile_model_programs.csv.gz"
INTAKE, IDLE = ["--set", "backend.fleet_intake=true"], ["--set", "backend.idle_start=true"]
VARIANTS: dict[str, tuple[list[str], str]] = {  # resim flags; the 0.6B calls' profile: own, fresh or leads
    "base": ([], "own"), "intake": (INTAKE, "own"), "idle": (IDLE, "own"), "intake+idle": (INTAKE + IDLE, "own"),
    "fresh": ([], "fresh"), "fresh+intake": (INTAKE, "fresh"), "intake+leads": (INTAKE, "leads")}


def flags(call: str, own: str, variant: str, folder: Path) -> list[str]:
    """resim's flags for a call in a variant: its engine's send path, the variant's settings."""
    extra, kind = VARIANTS[variant]
    model = json.loads((HERE / call / "settings.json").read_text())["args"].get("model", "qwen3-0.6b")
    profile = []
    if kind == "fresh" and model == "qwen3-0.6b":
        profile = ["--profile", FRESH]
    elif kind == "leads" and model == "qwen3-0.6b":
        own_profile = resim.call_profile(HERE / call, model)
        profile = ["--profile", str(with_leads(own_profile, FRESH, folder / f"{model}_with_leads.csv"))]
    return [*spc.VARIANTS[own], *extra, *profile]


def resimulated(call: str, own: str, variant: str, folder: Path) -> pd.DataFrame:
    path = folder / f"{call.replace('/', '_')}__{variant}.csv"
    if not path.is_file():
        resim.main(["--run", str(HERE / call), "--aggregated", *flags(call, own, variant, folder), "--out", str(path)])
    return pd.read_csv(path, dtype={"load": str})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resim-dir", type=Path, default=Path(tempfile.gettempdir()) / "ttft_variants")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=HERE / "ttft_variants.csv.gz")
    args = parser.parse_args(argv)
    args.resim_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for call, _, _, own in spc.CALLS:
        for variant in args.variants:
            sim = resimulated(call, own, variant, args.resim_dir)
            rows.append({"call": call, "send": own, "variant": variant, **spc.count(call, sim)})
    table = pd.DataFrame(rows)
    counts = [c for c in table.columns if c.endswith(("_within", "_of"))]
    totals = [{"call": "ALL", "variant": v, **table[table.variant == v][counts].sum().to_dict()}
              for v in args.variants]
    table = pd.concat([table, pd.DataFrame(totals)], ignore_index=True)
    table.to_csv(args.out, index=False)
    show = ["call", "variant", "all_within", "agg_within", "disagg_ttft_within", "disagg_tpot_within",
            "disagg_throughput_within", "disagg_transfer_within"]
    print(table[show].to_string(index=False))


if __name__ == "__main__":
    main()
