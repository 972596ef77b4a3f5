#!/usr/bin/env bash
# H100 device call(s) of the calibration: write each model's random-weight bf16 checkpoint to
# /tmp, calibrate the profiled cost model and compare the simulator with the engine on the target
# workloads (calibrate_and_compare.py), then bundle the results into $OUT/<model>_h100.tar.gz and
# copy each run.log beside it. Carry .whl (the Hydra wheels of ../shared/wheels) and .traces
# (azure_conv_2023.csv).
#   OUT=... GIT_COMMIT=... bash experiments/calibration/run_h100.sh both       # run 2: 0.6B, then 8B
#   OUT=... GIT_COMMIT=... bash experiments/calibration/run_h100.sh qwen3-0.6b # run 1: one model
#   OUT=/tmp/x bash experiments/calibration/run_h100.sh tiny-qwen3             # CPU dry run
# "both": the 8B checkpoint (about 110 s of CPU) is written in the background while the 0.6B runs,
# pinned to cores 12-15 with 4 threads; the 0.6B engine is pinned to cores 0-11. A driver starts
# no stage after its deadline (seconds from this script's start) and the whole call stops at HARD.
set -u
OUT=${OUT:?set OUT}
WHAT=$1; shift
START=$(date +%s)
HARD=${HARD:-525}
elapsed() { echo $(( $(date +%s) - START )); }
pin() {  # the command prefix that pins to a CPU list (nothing where taskset is missing)
  if command -v taskset > /dev/null; then echo "taskset -c $1"; fi
}

args_for() {  # model -> checkpoint folder, driver arguments
  case $1 in
    qwen3-0.6b) echo "/tmp/q06 --poisson-requests 400 --azure-requests 600 --azure-rate-scale 4";;
    qwen3-8b)   echo "/tmp/q8 --poisson-requests 200 --azure-requests 300 --azure-rate-scale 2 --num-random 20
                --prefill-tokens 16 64 256 1024 2048 4096 8192 16384 --prefill-contexts 0 1024
                --max-seconds-per-shape 0.3 --calibration-requests 384";;
    tiny-qwen3) echo "/tmp/tiny-qwen3 --hardware cpu --device cpu --grid quick --calibration-requests 24
                --bench-requests 16 --poisson-requests 16 --azure-requests 30 --azure-rate-scale 20
                --extra scheduler.max_model_len=512 cache.block_size=16 workload.prompt_len.high=200
                workload.output_len.high=48 workload.output_len.low=8";;
  esac
}

run_model() {  # model, deadline (s from START), cpu list, extra driver args...
  local model=$1 deadline=$2 cpus=$3; shift 3
  local spec; spec=($(args_for "$model"))
  local ck=${spec[0]} res=/tmp/results/${model}_h100
  mkdir -p "$res"
  { date -u; nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; nproc; } > "$res/env.txt" 2>&1
  local t=$(date +%s)
  [ -f "$ck/config.json" ] || python3 -m engine.checkpoint --preset "$model" --out "$ck" --dtype bfloat16 > /dev/null
  echo "checkpoint $model ready after $(( $(date +%s) - t )) s (at $(elapsed) s)" | tee -a "$res/env.txt"
  local now; now=$(elapsed)
  timeout $(( HARD - 15 - now )) $(pin "$cpus") python3 experiments/calibration/calibrate_and_compare.py \
      --model "$model" --checkpoint "$ck" --out "$res" --trace-dir .traces --git-commit "${GIT_COMMIT:-unknown}" \
      --deadline-s $(( deadline - now )) "${spec[@]:1}" "$@" 2>&1 | tee "$res/run.log"
  cp "$res/run.log" "$OUT/${model}_h100_run.log"
  tar czf "$OUT/${model}_h100.tar.gz" -C /tmp/results "${model}_h100"
  echo "$model bundled at $(elapsed) s"
}

python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
case $WHAT in
  both)
    ( t=$(date +%s); OMP_NUM_THREADS=4 $(pin 12-15) python3 -m engine.checkpoint --preset qwen3-8b --out /tmp/q8 \
        --dtype bfloat16 > /dev/null && echo "background qwen3-8b checkpoint: $(( $(date +%s) - t )) s" ) &
    WRITER=$!
    run_model qwen3-0.6b ${DEADLINE_06:-215} 0-11 "$@"
    wait $WRITER
    run_model qwen3-8b ${DEADLINE_8:-450} 0-15 "$@";;
  qwen3-0.6b|qwen3-8b|tiny-qwen3) run_model "$WHAT" ${DEADLINE:-400} 0-$(( $(nproc) - 1 )) "$@";;
  *) echo "unknown: $WHAT"; exit 2;;
esac
echo "total $(elapsed) s"
