#!/usr/bin/env bash
# H100 call 1 of the prefill graphs: GPU tests (tile-map prefill kernel, prefill graph replay vs
# eager, decode graphs, overlap, differential), the launch probe, the step probe (graphs vs
# eager) for Qwen3-0.6B and Qwen3-8B, and the 0.6B bench.
#   OUT=$OUT bash experiments/prefill_graphs/run_h100.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
{ date -u; nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; nproc; } > "$OUT/env.txt" 2>&1
mkdir -p /tmp/ckpt
python3 -m engine.checkpoint --preset qwen3-0.6b --out /tmp/ckpt/qwen3-0.6b --dtype bfloat16 > /dev/null
( OMP_NUM_THREADS=4 taskset -c 12-15 python3 -m engine.checkpoint --preset qwen3-8b --out /tmp/ckpt/qwen3-8b --dtype bfloat16 > /dev/null ) &
log "gpu tests"; timeout 240 taskset -c 0-11 python3 -m pytest -p no:cacheprovider -m gpu -q -rfE tests/kernels/test_prefill_attention.py \
    tests/engine/test_prefill_graphs.py tests/engine/test_cuda_graph.py tests/engine/test_overlap_gpu.py \
    tests/engine/test_llm_differential.py > "$OUT/pytest_gpu.log" 2>&1; tail -3 "$OUT/pytest_gpu.log"
log "step probe 0.6B"; timeout 120 taskset -c 0-11 python3 experiments/prefill_graphs/step_probe.py --ckpt /tmp/ckpt/qwen3-0.6b --out $OUT/q06 2>&1 | grep -v -i warn
log "bench 0.6B"; timeout 100 taskset -c 0-11 python3 experiments/engine/bench_engine.py --ckpt-root /tmp/ckpt --preset qwen3-0.6b --out $OUT/bench --variants default --no-profile 2>&1 | grep -i -E "tok/s|error" | head -5
wait
log "step probe 8B"; timeout 150 python3 experiments/prefill_graphs/step_probe.py --ckpt /tmp/ckpt/qwen3-8b --out $OUT/q8 2>&1 | grep -v -i warn
log done
