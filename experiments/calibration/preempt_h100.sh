#!/usr/bin/env bash
# H100 call: the bench with the KV cache pinned small enough to preempt (400 blocks of 256 tokens),
# both models, compared with the simulator calibrated by run 6 (profiled and roofline). Carry .whl
# (the Hydra wheels). Writes $OUT/preempt_<model>/ (compare.md, compare.csv, ...).
#   OUT=$OUT bash experiments/calibration/preempt_h100.sh
set -u
OUT=${OUT:?set OUT}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
# SKIP_06=1 / SKIP_8B=1 leave a model out
[ -n "${SKIP_8B:-}" ] || ( OMP_NUM_THREADS=4 taskset -c 12-15 python3 -m engine.checkpoint --preset qwen3-8b --out /tmp/q8 --dtype bfloat16 > /dev/null ) &
python3 -m engine.checkpoint --preset qwen3-0.6b --out /tmp/q06 --dtype bfloat16 > /dev/null
run() {  # model, checkpoint, cpus, its run-6 calibration folder
  timeout 200 taskset -c "$3" python3 -m harness experiment=compare model="$1" hardware=h100 backend.model="$2" \
    compare.profile_path=experiments/calibration/h100_run6/$4/model.csv workload=bench workload.num_requests=256 \
    cache.num_blocks=400 output.progress=false hydra.run.dir="$OUT/preempt_$1" 2>&1 | grep -v -i warn | tail -40
}
[ -n "${SKIP_06:-}" ] || run qwen3-0.6b /tmp/q06 0-11 qwen3_0_6b
wait
[ -n "${SKIP_8B:-}" ] || run qwen3-8b /tmp/q8 0-15 qwen3_8b
# every file in one bundle (a device call returns a limited number of files)
tar czf "$OUT/preempt.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d preempt_*)
