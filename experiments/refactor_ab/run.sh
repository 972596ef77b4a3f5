#!/usr/bin/env bash
# A/B for a refactor that must change no result: run the same inputs on a checkout and keep the
# tables. Run it on the commit before and the commit after, then compare.py the two folders.
#   bash experiments/refactor_ab/run.sh OUT [ENGINE_DIR]
# OUT: where the tables go. ENGINE_DIR: a saved CPU engine run (compare.engine_dir) so the CPU
# compare's simulated side is priced against the same measurement both times; without it the
# engine runs once here and its folder is kept under OUT/compare/engine.
set -euo pipefail
out=$(realpath -m "$1"); engine_dir=${2:-}
mkdir -p "$out"
common=(output.progress=false)
python -m harness "${common[@]}" hydra.run.dir="$out/default"
python -m harness "${common[@]}" fleet.replicas=3 router=least_tokens workload=poisson workload.rate=30 \
    workload.num_requests=300 hydra.run.dir="$out/fleet"
python -m harness "${common[@]}" experiment=plan workload.num_requests=200 'plan.hardware=[h100,a100]' \
    'plan.tp_sizes=[1]' 'plan.max_num_seqs=[128]' hydra.run.dir="$out/plan"
tiny=(model=tiny-qwen3 hardware=cpu backend.device=cpu scheduler.max_model_len=2048 workload.num_requests=16)
if [[ -n "$engine_dir" ]]; then
    python -m harness "${common[@]}" experiment=compare "${tiny[@]}" compare.engine_dir="$engine_dir" \
        hydra.run.dir="$out/compare"
else
    python -m harness "${common[@]}" experiment=compare "${tiny[@]}" hydra.run.dir="$out/compare"
fi
python -m pytest -q -p no:cacheprovider tests/harness/test_plan_pinned.py > "$out/pinned.txt" 2>&1 || true
