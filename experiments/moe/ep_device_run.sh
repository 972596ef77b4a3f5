#!/usr/bin/env bash
# Expert parallelism on two GPUs, each part's results under $OUT as it ends:
#   1. $OUT/ep_tests.txt     the fused kernel with other ranks' pairs skipped (fresh random inputs),
#                            EP=2 against TP=1 on the tiny MoE model (float32 greedy tokens equal,
#                            bfloat16 teacher forced), and TP=2's MoE test beside them
#   2. $OUT/ep_decode/       Qwen3-30B-A3B (random weights) decode throughput at TP=2, experts
#                            sliced (tp) against whole experts per rank (ep): decode.csv, summary.md
# then $OUT/summary.txt. Usage, from the repository root (no Hydra needed), about 4 minutes:
#   OUT=$OUT bash experiments/moe/ep_device_run.sh
# CPU=1 checks the plumbing without GPUs: the tiny MoE model's comparison over gloo, no tests.
set -uo pipefail
OUT=${OUT:?set OUT to the results folder}
CPU=${CPU:-0}
case $CPU in 0|1) ;; *) echo "CPU must be 0 or 1, got $CPU" >&2; exit 2;; esac
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
if [ "$CPU" = 0 ]; then
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)" || {
    echo "needs 2 CUDA devices (CPU=1 checks the script on the tiny model)" >&2; exit 2; }
fi
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
stamp() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }
stamp "device: $(python3 -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"), commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)"
if [ "$CPU" = 0 ]; then
  stamp "tests: start"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_moe_ep_gpu.py \
      tests/engine/test_moe_tp_gpu.py > "$OUT/ep_tests.txt" 2>&1
  stamp "tests: exit $? ($(tail -1 "$OUT/ep_tests.txt"))"
  ARGS=(--preset qwen3-30b-a3b)
else
  ARGS=(--preset tiny-qwen3-moe --device cpu --batches 1,4 --prompt-len 8 --output-len 8)
fi
stamp "decode: start"
timeout 300 python3 experiments/moe/ep_decode.py "${ARGS[@]}" --tp 2 --out "$OUT/ep_decode" > "$OUT/ep_decode.txt" 2>&1
stamp "decode: exit $?"
[ -f "$OUT/ep_decode/summary.md" ] && tee -a "$SUMMARY" < "$OUT/ep_decode/summary.md"
stamp "done"
