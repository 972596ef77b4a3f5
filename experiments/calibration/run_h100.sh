#!/usr/bin/env bash
# One H100 device call for one model: write its random-weight bf16 checkpoint to /tmp, calibrate
# the profiled cost model and compare the simulator with the engine on the three target workloads
# (calibrate_and_compare.py), then bundle the results into $OUT/<model>_h100.tar.gz (+ run.log).
# Carry .whl (the Hydra wheels of ../shared/wheels) and .traces (azure_conv_2023.csv).
#   OUT=... GIT_COMMIT=... bash experiments/calibration/run_h100.sh qwen3_0_6b|qwen3_8b [driver args]
# The driver starts no stage after DEADLINE s (default 400) from this script's start, and is
# stopped at HARD s (default 515) so the bundle is always written.
set -u
OUT=${OUT:?set OUT}
MODEL=$1; shift
START=$(date +%s)
case $MODEL in
  qwen3_0_6b) PRESET=qwen3-0.6b; CK=/tmp/q06
              ARGS="--poisson-requests 512 --azure-requests 600 --azure-rate-scale 4 --eager-bench";;
  qwen3_8b)   PRESET=qwen3-8b; CK=/tmp/q8
              ARGS="--poisson-requests 256 --azure-requests 300 --azure-rate-scale 2 --num-random 30
                    --prefill-tokens 16 64 256 1024 2048 4096 8192 16384 --prefill-contexts 0 1024";;
  tiny)       PRESET=tiny-qwen3; CK=/tmp/tiny-qwen3  # a CPU dry run of this script
              ARGS="--hardware cpu --device cpu --grid quick --calibration-requests 24 --bench-requests 16
                    --poisson-requests 16 --azure-requests 30 --azure-rate-scale 20 --extra scheduler.max_model_len=512
                    cache.block_size=16 workload.prompt_len.high=200 workload.output_len.high=48 workload.output_len.low=8";;
  *) echo "unknown model $MODEL"; exit 2;;
esac
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
NAME=${MODEL}_h100
RES=/tmp/results/$NAME
mkdir -p $RES
{ date -u; nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; nproc; } > $RES/env.txt 2>&1
t=$(date +%s)
[ -f $CK/config.json ] || python3 -m engine.checkpoint --preset $PRESET --out $CK --dtype bfloat16 > /dev/null
echo "checkpoint $PRESET: $(( $(date +%s) - t )) s" | tee -a $RES/env.txt
NOW=$(( $(date +%s) - START ))
timeout $(( ${HARD:-515} - NOW )) python3 experiments/calibration/calibrate_and_compare.py --model $MODEL \
    --checkpoint $CK --out $RES --trace-dir .traces --git-commit "${GIT_COMMIT:-unknown}" \
    --deadline-s $(( ${DEADLINE:-400} - NOW )) $ARGS "$@" 2>&1 | tee $RES/run.log
cp $RES/run.log $OUT/${NAME}_run.log
tar czf $OUT/$NAME.tar.gz -C /tmp/results $NAME
echo "bundle: $(du -h $OUT/$NAME.tar.gz | cut -f1), total $(( $(date +%s) - START )) s"
