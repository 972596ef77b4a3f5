#!/usr/bin/env bash
# One H100 device call for async scheduling: the bench with and without it (Qwen3-0.6B, then
# Qwen3-8B), the engine's GPU tests in between while the 8B checkpoint is written in the
# background, everything under $OUT (bench.csv, steps.csv, bench.md, pytest_gpu.log, env.txt).
#   OUT=$OUT bash experiments/async/run_h100.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
CK=/tmp/ckpt
B="python3 experiments/engine/bench_engine.py --ckpt-root $CK --out $OUT"
pin() { if command -v taskset > /dev/null; then echo "taskset -c $1"; fi; }
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
{ date -u; nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; nproc; } > "$OUT/env.txt" 2>&1
log "bench qwen3-0.6b default (async) and sync"; timeout 150 $B --preset qwen3-0.6b --variants default,sync
log "writing qwen3-8b in the background"
( t=$(date +%s); OMP_NUM_THREADS=4 $(pin 12-15) python3 -m engine.checkpoint --preset qwen3-8b --out $CK/qwen3-8b --dtype bfloat16 > /dev/null; echo "8b checkpoint: $(( $(date +%s) - t )) s" ) &
WRITER=$!
log "gpu tests"; timeout 200 $(pin 0-11) python3 -m pytest -p no:cacheprovider -m gpu -q -rfE tests/engine > "$OUT/pytest_gpu.log" 2>&1; tail -3 "$OUT/pytest_gpu.log"
log "waiting for the 8b checkpoint"; wait $WRITER
log "bench qwen3-8b default (async) and sync"; timeout 200 $B --preset qwen3-8b --variants default,sync
python3 experiments/engine/summarize.py "$OUT" > /dev/null
log done
