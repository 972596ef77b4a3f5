#!/usr/bin/env bash
# Data parallelism on 2 GPUs (device kind nvidia-h200-x2), the engine half: Qwen3-0.6B, a pinned
# KV cache of NUM_BLOCKS blocks per replica, steps overlapped as in a single engine run (each
# replica process runs its own loop). 1) one replica's offline capacity (req/s) on the Poisson
# workload's lengths; 2) two engine replicas behind round-robin and least-outstanding routing,
# Poisson and the Azure trace rescaled, at LOAD x 2 x that capacity. Only summary.csv files are
# kept (OUT/engine_<case>/, replica_<i>/ too), with the log (OUT/run.log).
#   OUT=$OUT bash experiments/fleet/validate_dp.sh   (carry .hyd: the Hydra wheels; .traces)
# The simulated half runs anywhere: experiments/fleet/simulate_dp.sh OUT
set -euo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT}
NUM_REQUESTS=${NUM_REQUESTS:-600}
LOAD=${LOAD:-0.8}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
# shellcheck source=experiments/fleet/dp_common.sh
source experiments/fleet/dp_common.sh
cp .traces/azure_conv_2023.csv .   # workload.trace_path is read from the cwd
if ! python3 -c "import hydra" 2>/dev/null; then  # the carried wheels, where the machine has no Hydra
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .hyd/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
keep() {  # the run's summary.csv, and each replica's
  mkdir -p "$OUT/$1"
  cp "/tmp/dp/$1/summary.csv" "$OUT/$1/"
  for d in "/tmp/dp/$1"/replica_*; do
    [ -d "$d" ] && mkdir -p "$OUT/$1/$(basename "$d")" && cp "$d/summary.csv" "$OUT/$1/$(basename "$d")/"
  done
  return 0
}

CUDA_VISIBLE_DEVICES=0 python3 -m harness $COMMON backend=engine workload=poisson workload.arrival=offline \
    workload.rate=null workload.num_requests="$NUM_REQUESTS" hydra.run.dir=/tmp/dp/capacity
keep capacity
RATE=$(python3 -c "import pandas as pd; print(round($LOAD * 2 * pd.read_csv('$OUT/capacity/summary.csv')['request_s'][0], 3))")
echo "fleet rate $RATE req/s ($LOAD x 2 replicas' offline capacity)" | tee "$OUT/rate.txt"
for router in round_robin least_requests; do
  for name in poisson trace; do
    python3 -m harness $COMMON backend=engine fleet.replicas=2 router=$router $(workload_of "$name" "$RATE") \
        hydra.run.dir="/tmp/dp/engine_${name}_${router}"
    keep "engine_${name}_${router}"
  done
done
