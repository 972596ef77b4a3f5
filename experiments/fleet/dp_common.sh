# Shared by validate_dp.sh (engine) and simulate_dp.sh (simulator): the same model, cache, step
# mode and workloads on both sides. Steps overlap (async scheduling, the default with CUDA and TP 1)
# on both: an engine replica runs its own loop as a single engine does, and the profiled cost
# model was fitted on such runs.
NUM_BLOCKS=${NUM_BLOCKS:-2000}
NUM_REQUESTS=${NUM_REQUESTS:-600}
COMMON="model=qwen3-0.6b hardware=h200 cache.num_blocks=$NUM_BLOCKS \
output.progress=false output.plots=false output.steps=none"
# the Azure conversation trace's own rate, requests per second (19,366 requests over its hour)
TRACE_RATE=5.38

workload_of() {  # workload overrides of case $1 (poisson | trace) at $2 requests per second
  if [ "$1" = poisson ]; then
    echo "workload=poisson workload.rate=$2 workload.num_requests=$NUM_REQUESTS"
  else
    echo "workload=trace workload.trace_path=azure_conv_2023.csv workload.name=azure_conv \
workload.rate_scale=$(python3 -c "print(round($2 / $TRACE_RATE, 3))") workload.num_requests=$NUM_REQUESTS"
  fi
}
