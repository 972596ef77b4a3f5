#!/usr/bin/env bash
# One device call after FlashAttention-4 is installed (experiments/flash_attn/README.md): GPU tests
# of the flash-attn backend, dtypes and prefill kernel; the per-phase microbenchmark; nano-vllm's
# bench per attention backend. Results under $OUT.
#   OUT=$OUT bash experiments/flash_attn/run_gpu.sh [preset ...]
set -uo pipefail
export PYTHONUNBUFFERED=1
presets=("${@:-qwen3-0.6b}")
python3 -c "import flash_attn.cute, torch; print('FA4 imports; torch', torch.__version__, torch.cuda.get_device_name())" \
    2>&1 | tee "$OUT/env.txt"
timeout 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_flash_attn_backend.py \
    tests/engine/test_dtypes_gpu.py tests/kernels/test_prefill_attention.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
timeout 150 python3 experiments/flash_attn/bench_phases.py --out "$OUT" > "$OUT/phases.txt" 2>&1; tail -60 "$OUT/phases.txt"
for preset in "${presets[@]}"; do
    timeout 300 python3 experiments/engine/bench_engine.py --preset "$preset" --variants default,triton,flash_attn \
        --out "$OUT/bench_$preset" --no-profile 2>&1 | tail -8
done
