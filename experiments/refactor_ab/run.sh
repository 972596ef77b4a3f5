#!/usr/bin/env bash
# A/B for a refactor that must change no result: run the same inputs on a checkout and keep the
# tables. Run it on the commit before and the commit after, then compare.py the two folders.
#   bash experiments/refactor_ab/run.sh OUT [BEFORE]
# OUT: where the tables go. BEFORE: the OUT of the first checkout's run; its CPU engine run and the
# fit profiled from it are reused (compare.engine_dir, compare.profile_path), so the CPU compare's
# simulated sides are priced against the same measurement both times. Without it the engine runs
# and is profiled here (wall-clock timings: they differ from run to run).
#   python experiments/refactor_ab/compare.py BEFORE OUT   # every table equal, or the differences
set -euo pipefail
out=$(realpath -m "$1"); before=${2:+$(realpath "$2")}
mkdir -p "$out"
common=(output.progress=false)
python -m harness "${common[@]}" hydra.run.dir="$out/default"
python -m harness "${common[@]}" fleet.replicas=3 router=least_tokens workload=poisson workload.rate=30 \
    workload.num_requests=300 hydra.run.dir="$out/fleet"
python -m harness "${common[@]}" experiment=plan workload.num_requests=200 'plan.hardware=[h100,a100]' \
    'plan.tp_sizes=[1]' 'plan.max_num_seqs=[128]' hydra.run.dir="$out/plan"
tiny=(model=tiny-qwen3 hardware=cpu backend.device=cpu scheduler.max_model_len=2048 workload.num_requests=16)
if [[ -n "$before" ]]; then
    # inputs read from the first run, not written here: compare.py leaves them out
    printf 'compare/engine/requests.csv\ncompare/engine/steps.csv.gz\ncompare/engine/summary.csv\ncompare/profile.csv\ncompare/profile_model.csv\n' \
        > "$out/REUSED"
    python -m harness "${common[@]}" experiment=compare "${tiny[@]}" compare.engine_dir="$before/compare/engine" \
        compare.profile_path="$before/compare/profile_model.csv" hydra.run.dir="$out/compare"
else
    python -m harness "${common[@]}" experiment=compare "${tiny[@]}" hydra.run.dir="$out/compare"
fi
python -m pytest -q -p no:cacheprovider tests/harness/test_plan_pinned.py > "$out/pinned.txt" 2>&1 || true
