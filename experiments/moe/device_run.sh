#!/usr/bin/env bash
# Issue 33's MoE device call on one GPU (H100 or H200), each part's results under $OUT as it ends:
#   1. $OUT/tests.txt      GPU tests of the MoE kernels (router, alignment, fused experts, the norm
#                          that sums the top-k) against float32 references, fresh random inputs
#   2. $OUT/tune/          the fused-MoE tile table of this GPU, tuned where it has none (an H100);
#                          TUNE=missing also adds the token counts a table lacks (the prefill sizes
#                          8192 and 16384), TUNE=skip never tunes; the table to commit is
#                          $OUT/tune/fused_moe_*.json
#   3. $OUT/bench/         nano-vllm's bench on Qwen3-30B-A3B (256 requests, random weights) and its
#                          bandwidth bound: bench.csv, bound.json (fraction_of_bound; target 0.70)
#   4. $OUT/skew/          64 requests of the same bench with the expert counter on:
#                          expert_counts_counts.csv, skew.json (the routing skew sim.moe fits to them)
#   5. $OUT/layer.csv      one MoE layer per op, before/after the routing fusion (profile_layer.py)
# then $OUT/summary.txt. Usage, from the repository root (no Hydra needed):
#   OUT=$OUT bash experiments/moe/device_run.sh            # H200 about 5-6 minutes, H100 (tunes) 7-9
#   OUT=$OUT PARTS=bench,skew bash experiments/moe/device_run.sh   # a subset, in the order above
# Each part has its own time limit, so one that hangs leaves the later ones their time.
# CPU=1 checks the plumbing without a GPU (tests/test_moe_device_script.py): the tiny MoE model's
# bench, bound (at a given 1 TB/s) and skew on 4 requests; tests, tune and layer need CUDA and are skipped.
set -uo pipefail
OUT=${OUT:?set OUT to the results folder}
PARTS=${PARTS:-tests,tune,bench,skew,layer}
TUNE=${TUNE:-auto}
TUNE_BUDGET_S=${TUNE_BUDGET_S:-120}
SKEW_REQUESTS=64
BENCH_REQUESTS=256
CPU=${CPU:-0}
PRESET=qwen3-30b-a3b
BENCH_ARGS=()
BOUND_ARGS=(--measure)
if [ "$CPU" = 1 ]; then
  PRESET=tiny-qwen3-moe
  BENCH_ARGS=(--device cpu --max-model-len 256)
  BENCH_REQUESTS=4
  BOUND_ARGS=(--copy-tb-s 1 --num-requests 4 --max-model-len 256)
  SKEW_REQUESTS=4
  PARTS=$(echo ",$PARTS," | sed -e 's/,tests,/,/; s/,tune,/,/; s/,layer,/,/' -e 's/^,//; s/,$//')
elif [ "$CPU" != 0 ]; then
  echo "CPU must be 0 or 1, got $CPU" >&2; exit 2
fi
for part in ${PARTS//,/ }; do
  case $part in tests|tune|layer|bench|skew) ;; *) echo "PARTS: unknown part '$part' (tests, tune, layer, bench, skew)" >&2; exit 2;; esac
done
[[ $TUNE_BUDGET_S =~ ^[0-9]+$ ]] || { echo "TUNE_BUDGET_S must be whole seconds, got $TUNE_BUDGET_S" >&2; exit 2; }
case $TUNE in auto|missing|skip) ;; *) echo "TUNE must be auto, missing or skip, got $TUNE" >&2; exit 2;; esac
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
[ "$CPU" = 1 ] || python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "no CUDA device: this script is for a GPU (CPU=1 checks it on the tiny model)" >&2; exit 2; }
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
DEVICE=$(python3 -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')")
echo "device: $DEVICE, commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)" | tee "$SUMMARY"
wants() { [[ ",$PARTS," == *",$1,"* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }

if wants tests; then
  stamp "tests: start"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_route.py \
      tests/kernels/test_moe_align.py tests/kernels/test_fused_moe.py "tests/kernels/test_fused_rmsnorm.py" \
      -k "not test_fused_moe_matches_float32_reference and not test_rms_norm and not per_head" > "$OUT/tests.txt" 2>&1
  stamp "tests: exit $? ($(tail -1 "$OUT/tests.txt"))"
fi

if wants tune; then
  TABLE=$(python3 -c "from kernels.moe_configs import table_path; print(table_path(128, 768, 'bfloat16', '$DEVICE'))")
  if [ "$TUNE" = skip ] || { [ "$TUNE" = auto ] && [ -f "$TABLE" ]; }; then
    stamp "tune: skipped (TUNE=$TUNE; $(basename "$TABLE") $([ -f "$TABLE" ] && echo exists || echo missing))"
  else
    stamp "tune: start (budget ${TUNE_BUDGET_S} s; the token counts $(basename "$TABLE") lacks)"
    mkdir -p "$OUT/tune"
    timeout $((TUNE_BUDGET_S + 150)) python3 experiments/moe/tune_fused_moe.py --missing-only \
        --budget-s "$TUNE_BUDGET_S" --report "$OUT/tune/report.json" > "$OUT/tune/tune.txt" 2>&1
    status=$?
    if [ -f "$TABLE" ]; then cp "$TABLE" "$OUT/tune/"; fi
    stamp "tune: exit $status ($(tail -1 "$OUT/tune/tune.txt"))"
  fi
fi

if wants bench; then
  stamp "bench: start"
  timeout 200 python3 experiments/engine/bench_engine.py --preset $PRESET --load-format dummy --variants default \
      "${BENCH_ARGS[@]}" --num-requests $BENCH_REQUESTS --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
  stamp "bench: exit $? ($(grep "output tokens" "$OUT/bench.txt" | tail -1))"
  if [ -f "$OUT/bench/steps.csv" ]; then
    timeout 60 python3 experiments/moe/decode_bound.py --preset $PRESET --steps "$OUT/bench/steps.csv" \
        --bench "$OUT/bench/bench.csv" "${BOUND_ARGS[@]}" > "$OUT/bench/bound.txt" 2>&1
    stamp "bound: $(grep -E '"(bound_output_tok_s|measured_output_tok_s|fraction_of_bound)"' "$OUT/bench/bound.json" | tr -d '\n ')"
    gzip -f "$OUT/bench/steps.csv"  # per-step rows: kept compressed for the bound, not for the repository
  fi
fi

if wants skew; then
  stamp "skew: start"
  mkdir -p "$OUT/skew"
  timeout 150 python3 experiments/engine/bench_engine.py --preset $PRESET --load-format dummy --variants counts \
      "${BENCH_ARGS[@]}" --num-requests $SKEW_REQUESTS --out "$OUT/skew" > "$OUT/skew/bench.txt" 2>&1
  stamp "skew bench: exit $? ($(grep "output tokens" "$OUT/skew/bench.txt" | tail -1))"
  rm -f "$OUT/skew/steps.csv"
  if [ -f "$OUT/skew/expert_counts_counts.csv" ]; then
    TOP_K=$(python3 -c "from engine.core.model_shapes import model_shape; print(model_shape('$PRESET').num_experts_per_tok)")
    python3 experiments/moe/fit_skew.py "$OUT/skew/expert_counts_counts.csv" --top-k "$TOP_K" > "$OUT/skew/fit.txt" 2>&1
    stamp "skew: $(grep -E '"skew"' "$OUT/skew/skew.json" | tr -d '\n ')"
  fi
fi
if wants layer; then
  stamp "layer: start"
  timeout 120 python3 experiments/moe/profile_layer.py --out "$OUT/layer.csv" > "$OUT/layer.txt" 2>&1
  stamp "layer: exit $?"; grep "^T=" "$OUT/layer.txt" | tee -a "$SUMMARY"
fi

stamp "done"
