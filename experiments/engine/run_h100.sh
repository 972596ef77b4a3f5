#!/usr/bin/env bash
# One H100 device call: the headline bench first, then GPU tests and the other variants by
# priority, everything under $OUT (bench.csv, steps.csv, bench.md, pytest.log, env.txt; the
# caller tees stdout to run.log). The Qwen3-8B checkpoint (16 GB of random bf16) is written in
# the background once the headline run is done.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
CK=/tmp/ckpt
B="python3 experiments/engine/bench_engine.py --ckpt-root $CK --out $OUT"
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
{ nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; nproc; } > "$OUT/env.txt" 2>&1
log "bench qwen3-0.6b default"; timeout 100 $B --preset qwen3-0.6b --variants default
log "writing qwen3-8b in the background"
( t=$(date +%s); python3 -m engine.checkpoint --preset qwen3-8b --out $CK/qwen3-8b --dtype bfloat16; echo "8b checkpoint: $(( $(date +%s) - t )) s" ) &
WRITER=$!
log "gpu tests"; timeout 150 python3 -m pytest -p no:cacheprovider -m gpu -q -s -rA tests/engine/test_cuda_graph.py tests/engine/test_kv_sizing.py > "$OUT/pytest.log" 2>&1; tail -4 "$OUT/pytest.log"
log "bench qwen3-0.6b compiled"; timeout 90 $B --preset qwen3-0.6b --variants compiled
log "bench qwen3-0.6b eager"; timeout 90 $B --preset qwen3-0.6b --variants eager
log "waiting for the 8b checkpoint"; wait $WRITER
log "bench qwen3-8b default"; timeout 120 $B --preset qwen3-8b --variants default
log "bench qwen3-0.6b torch"; timeout 200 $B --preset qwen3-0.6b --variants torch
python3 experiments/engine/summarize.py "$OUT" > /dev/null
log done
