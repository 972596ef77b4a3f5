#!/usr/bin/env bash
# Sampling from vocabulary slices at TP=2 (engine/sharded_sampling.py, issue 16): two calls on
# nvidia-h200-x2, the machine held between them (the checkpoint in /tmp/ckpt is reused).
#   OUT=$OUT bash experiments/tp/run_sharded.sh bench   # carry .old: the tree before the change
#   OUT=$OUT bash experiments/tp/run_sharded.sh tests
# bench: nano-vllm's bench on Qwen3-8B, TP=1 and TP=2 with this tree, TP=2 with the tree before
# the change (git archive of the parent commit, unpacked into .old), then TP=2 with this tree
# again (A-B-A: the machine's drift shows in the two A runs); the sampling kernel's GPU tests.
# tests: the TP GPU tests (float32 TP=2 against TP=1 over both sampling paths, bf16 teacher
# forced) and three TP engines in one process, each shutdown timed.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=. PYTHONUNBUFFERED=1
case "${1:-bench}" in
bench)
    timeout 240 python3 experiments/engine/bench_engine.py --preset qwen3-8b --variants default,tp2 \
        --out "$OUT/bench8b" --no-profile > "$OUT/bench8b.log" 2>&1
    (cd .old && PYTHONPATH=. timeout 100 python3 experiments/engine/bench_engine.py --preset qwen3-8b --variants tp2 \
        --out "$OUT/bench8b_before" --no-profile > "$OUT/bench8b_before.log" 2>&1)
    timeout 100 python3 experiments/engine/bench_engine.py --preset qwen3-8b --variants tp2 \
        --out "$OUT/bench8b_again" --no-profile > "$OUT/bench8b_again.log" 2>&1
    grep -h "tok/s" "$OUT"/bench8b*.log
    timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_fused_sampling.py 2>&1 \
        | tee "$OUT/pytest_sampling.log" | tail -3
    ;;
tests)
    mkdir -p "$OUT/tp"
    TP_REPORT_DIR="$OUT/tp" timeout 330 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/engine/test_tp_gpu.py \
        > "$OUT/pytest_tp.log" 2>&1
    tail -5 "$OUT/pytest_tp.log"
    timeout 200 python3 -m experiments.tp.second_engine 2>&1 | grep -v Warning | tee "$OUT/second_engine.log"
    ;;
esac
