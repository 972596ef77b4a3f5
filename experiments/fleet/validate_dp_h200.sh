#!/usr/bin/env bash
# Data parallelism against the simulator on 2 x H200: Qwen3-8B, two engine replicas (one per GPU)
# behind round-robin and least-outstanding routing, Poisson and Azure-trace arrivals at 80% of the
# fleet's capacity (twice one replica's measured capacity at P90 TTFT 1 s / TPOT 50 ms); the same
# fleets simulated; compare_fleet.py tabulates TTFT/TPOT P50/P90, engine against simulator.
#   bash experiments/fleet/validate_dp_h200.sh [OUT]   (default OUT: experiments/fleet/h200x2)
set -euo pipefail
OUT=${1:-experiments/fleet/h200x2}
COMMON="model=qwen3-8b hardware=h200 output.progress=false"
SIM=${SIM:-}   # e.g. SIM="backend.cost_model=profiled backend.profile_path=<an H200 profile.csv>"
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/env.txt"; git rev-parse HEAD >> "$OUT/env.txt"

# 1. one replica's capacity on the engine (req/s meeting the SLO)
CUDA_VISIBLE_DEVICES=0 python -m harness experiment=capacity $COMMON backend=engine study.param=null \
    workload.num_requests=400 hydra.run.dir="$OUT/capacity_one_replica"
RATE=$(python -c "import pandas as pd; print(round(0.8 * 2 * pd.read_csv('$OUT/capacity_one_replica/capacity.csv')['capacity_req_s'][0], 3))")
# the Azure conversation trace runs at ~5.38 req/s (19,366 requests in an hour): scale it to RATE
SCALE=$(python -c "print(round($RATE / 5.38, 3))")
echo "fleet rate $RATE req/s (trace rate_scale $SCALE)" | tee -a "$OUT/env.txt"

for router in round_robin least_requests; do
  for load in "poisson workload.rate=$RATE workload.num_requests=1000" \
              "trace_azure_conv workload.rate_scale=$SCALE workload.num_requests=1000"; do
    name=$(echo "$load" | cut -d' ' -f1)
    python -m harness $COMMON backend=engine fleet.replicas=2 router=$router workload=$load \
        hydra.run.dir="$OUT/engine_${name}_${router}"
    python -m harness $COMMON $SIM fleet.replicas=2 router=$router workload=$load \
        hydra.run.dir="$OUT/sim_${name}_${router}"
  done
done
python experiments/fleet/compare_fleet.py "$OUT"
