#!/usr/bin/env bash
# How repeatable is the engine's own measurement? The online comparisons of a calibration run
# again (same workload, same seeds, same fitted model.csv), REPEATS times each, on a fresh process
# per run. Carry .whl and .traces like run_h100.sh.
#   OUT=$OUT REPEATS=2 bash experiments/calibration/repeat_h100.sh qwen3-8b experiments/calibration/h100_run3/qwen3_8b
set -u
OUT=${OUT:?set OUT}
MODEL=$1; RUN=$2; REPEATS=${REPEATS:-2}
case $MODEL in
  qwen3-0.6b) CK=/tmp/q06;;
  qwen3-8b) CK=/tmp/q8;;
esac
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
[ -f "$CK/config.json" ] || python3 -m engine.checkpoint --preset "$MODEL" --out "$CK" --dtype bfloat16 > /dev/null
overrides() {  # the stage's workload overrides, from the calibration run's meta.json
  python3 -c "import json,sys; print(' '.join(json.load(open('$RUN/meta.json'))['stages']['$1']['overrides']))"
}
mkdir -p "$OUT/${MODEL}_repeat"
for r in $(seq 1 "$REPEATS"); do
  for stage in compare_poisson compare_azure; do
    dir=$OUT/${MODEL}_repeat/${stage}_r$r
    python3 -m harness experiment=compare model=$MODEL hardware=h100 backend.model=$CK output.progress=false \
        compare.profile_path=$RUN/model.csv $(overrides $stage) hydra.run.dir=$dir > "$dir.log" 2>&1 || tail -5 "$dir.log"
    grep -E "\| (output_tok_s|ttft_p50_s|ttft_p90_s|tpot_p50_s|tpot_p90_s) \|" "$dir/compare.md" | sed "s/^/$stage r$r /"
  done
done
