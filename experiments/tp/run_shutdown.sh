#!/usr/bin/env bash
# TP shutdown on nvidia-h200-x2 (issue 16): where rank 0 waits (shutdown_probe, auto and NCCL),
# three engines in one process (second_engine), and the TP GPU tests, which start several.
#   OUT=$OUT bash experiments/tp/run_shutdown.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=. PYTHONUNBUFFERED=1
for mode in auto nccl; do
    timeout 100 python3 -m experiments.tp.shutdown_probe --all-reduce $mode --dump-after 8 2>&1 \
        | grep -v "Warning\|warn(\|^\s*$" > "$OUT/shutdown_probe_$mode.log"
    grep -E "^up|rank 0 le|shutdown took" "$OUT/shutdown_probe_$mode.log"
done
timeout 150 python3 -m experiments.tp.second_engine 2>&1 | grep "^engine" | tee "$OUT/second_engine.log"
mkdir -p "$OUT/tp"
TP_REPORT_DIR="$OUT/tp" timeout 250 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/engine/test_tp_gpu.py \
    tests/engine/test_tp_all_reduce_setup.py > "$OUT/pytest_tp.log" 2>&1
tail -4 "$OUT/pytest_tp.log"
