#!/usr/bin/env bash
# Second H100 call: GPU tests of the split-vocabulary sampling kernel and the overlapped steps,
# then the Qwen3-0.6B bench: default with the step profile, default twice and sync without it
# (the headline: no per-step events, as nano-vllm's bench), then the kernel profile.
#   OUT=$OUT bash experiments/async/run2_h100.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
CK=/tmp/ckpt
B="python3 experiments/engine/bench_engine.py --ckpt-root $CK --preset qwen3-0.6b"
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
{ date -u; nvidia-smi; lscpu | head -20; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; } > "$OUT/env.txt" 2>&1
log "gpu tests"; timeout 200 python3 -m pytest -p no:cacheprovider -m gpu -q -rfE tests/kernels/test_fused_sampling.py \
    tests/engine/test_sampler_gpu.py tests/engine/test_overlap_gpu.py tests/engine/test_llm_differential.py \
    tests/engine/test_cuda_graph.py > "$OUT/pytest_gpu.log" 2>&1; tail -3 "$OUT/pytest_gpu.log"
log "bench, profiled"; timeout 120 $B --out $OUT/profiled --variants default,sync
log "bench, headline"; timeout 150 $B --out $OUT/headline --variants default,sync,default --no-profile
python3 experiments/engine/summarize.py "$OUT/profiled" > /dev/null
python3 experiments/engine/summarize.py "$OUT/headline" > /dev/null
log "kernel profile"; timeout 120 python3 experiments/async/profile_decode.py --ckpt $CK/qwen3-0.6b --out $OUT/kernels 2>&1 | grep -v -i warn | head -3
log done
