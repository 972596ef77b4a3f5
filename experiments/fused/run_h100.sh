#!/usr/bin/env bash
# One H100 device call for the fused kernels: their GPU tests first (kernels against float32
# references, graph capture, model wiring against the torch path, sampler paths, no host syncs),
# then the engine bench of Qwen3-0.6B without and with EngineConfig.fused_kernels="triton".
# Everything lands under $OUT (env.txt, pytest.log, bench.csv, steps.csv, bench.md); the caller
# tees stdout to run.log.
#   OUT=... bash experiments/fused/run_h100.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
CK=/tmp/ckpt
B="python3 experiments/engine/bench_engine.py --ckpt-root $CK --out $OUT --preset qwen3-0.6b"
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
{ nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; nproc; } > "$OUT/env.txt" 2>&1
log "gpu tests: fused kernels, sampler, model wiring"
timeout 420 python3 -m pytest -p no:cacheprovider -m gpu -q -rfE \
    tests/kernels/test_fused_rmsnorm.py tests/kernels/test_fused_activation.py tests/kernels/test_fused_rotary.py \
    tests/kernels/test_fused_sampling.py tests/kernels/test_fused_graph_capture.py \
    tests/engine/test_sampler_gpu.py tests/engine/test_layers_fused.py > "$OUT/pytest.log" 2>&1
tail -15 "$OUT/pytest.log"
log "bench qwen3-0.6b default,fused"; timeout 240 $B --variants default,fused
log "bench qwen3-0.6b fused_eager"; timeout 120 $B --variants fused_eager
python3 experiments/engine/summarize.py "$OUT" > /dev/null
log done
