#!/usr/bin/env bash
# The code_completion class (harness/fidelity/classes.py) served at 50/80/95% of capacity with step
# replays (STEPS=1: per-step prices and per-cell request windows under <tag>/steps/), one device
# command per GPU kind. Carry .hyd (the Hydra wheels) and .traces (azure_conv_2023.csv: the arrivals).
#   OUT=$OUT GPU=h100 bash experiments/fidelity/code_completion_gpu.sh  # 2 x H100: 0.6B on GPU 0, 8B on GPU 1
#   OUT=$OUT GPU=h200 bash experiments/fidelity/code_completion_gpu.sh  # 1 x H200: its own grid fit and the carried H100 fit
# h100: Qwen3-0.6B (1,500 requests a cell, the committed fit h100_leakfree/profile_model.csv) and
# Qwen3-8B (400 requests, h100_8b/qwen3-8b_grid_fit.csv), both checkpoints written first, then
# both calls side by side; h200: Qwen3-0.6B, 1,500 requests, a fresh grid (profile.csv for the
# H200's own fit, committed raw) and the carried fit h200/qwen3-0.6b_from_h100.csv.
# ONLY=qwen3-0.6b or ONLY=qwen3-8b keeps one of the H100 calls (on GPU 0): one H100 a command.
# N_SMALL / N_8B: requests a cell for the 0.6B / 8B (a shorter call). DRY_RUN=1 prints the calls and checks the inputs without a GPU. Results: $OUT/<model>/code_completion/
# (heldout.csv, schedules.csv, steps/*_windows.csv, run.log) and $OUT/<model>/profile*.csv.
set -euo pipefail
OUT=${OUT:?set OUT}
GPU=${GPU:-h100}
WHEELS=${WHEELS:-.hyd}
HERE=experiments/fidelity
common="WORKLOADS=code_completion LOADS=0.5,0.8,0.95 STEPS=1 WHEELS=$WHEELS OUT=$OUT"
case $GPU in
  h100)
    calls=("CUDA_VISIBLE_DEVICES=0 MODEL=qwen3-0.6b NUM_REQUESTS=${N_SMALL:-1500} PROFILE=$HERE/h100_leakfree/profile_model.csv"
           "CUDA_VISIBLE_DEVICES=1 MODEL=qwen3-8b NUM_REQUESTS=${N_8B:-400} PROFILE=$HERE/h100_8b/qwen3-8b_grid_fit.csv");;
  h200)
    calls=("MODEL=qwen3-0.6b NUM_REQUESTS=1500 HARDWARE=h200 CARRIED=$HERE/h200/qwen3-0.6b_from_h100.csv");;
  *) echo "GPU must be h100 or h200, got $GPU" >&2; exit 2;;
esac
if [ -n "${ONLY:-}" ]; then
  kept=()
  for c in "${calls[@]}"; do case "$c " in *"MODEL=$ONLY "*) kept+=("${c/CUDA_VISIBLE_DEVICES=1/CUDA_VISIBLE_DEVICES=0}");; esac; done
  [ ${#kept[@]} -gt 0 ] || { echo "ONLY=$ONLY: no $GPU call serves that model" >&2; exit 2; }
  calls=("${kept[@]}")
fi
for f in "$HERE/h100_leakfree/profile_model.csv" "$HERE/h100_8b/qwen3-8b_grid_fit.csv" "$HERE/h200/qwen3-0.6b_from_h100.csv"; do
  [ -f "$f" ] || { echo "missing $f" >&2; exit 2; }
done
[ -f .traces/azure_conv_2023.csv ] || { echo "code_completion needs .traces/azure_conv_2023.csv: carry .traces" >&2; exit 2; }
if [ -n "${DRY_RUN:-}" ]; then
  for c in "${calls[@]}"; do echo "env $common $c bash $HERE/run_gpu.sh"; done
  exit 0
fi
ls "$WHEELS"/hydra_core-*.whl > /dev/null 2>&1 || { echo "WHEELS=$WHEELS holds no hydra_core wheel: carry it" >&2; exit 2; }
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
export PYTHONPATH=.:/tmp/site
python3 -c "import hydra, omegaconf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl
# checkpoints first, one at a time: writing the 8B's takes the host's cores for a minute or two,
# which would slow the 0.6B's host-bound steps if it ran beside a serving call
for c in "${calls[@]}"; do
  model=$(echo "$c" | sed -E 's/.*MODEL=([^ ]+).*/\1/')
  [ -f "/tmp/ck/$model/config.json" ] || python3 -m engine.checkpoint --preset "$model" --out "/tmp/ck/$model" --dtype bfloat16 > /dev/null
done
pids=()
for c in "${calls[@]}"; do
  model=$(echo "$c" | sed -E 's/.*MODEL=([^ ]+).*/\1/')
  mkdir -p "$OUT/$model"
  env $common $c bash $HERE/run_gpu.sh > "$OUT/$model/call.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
tail -n 5 "$OUT"/*/call.log
exit $status
