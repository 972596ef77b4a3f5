#!/usr/bin/env bash
# One device call: the code_completion class (Qwen3-0.6B, one H200) served with prefill CUDA graphs
# up to GRAPH_TOKENS tokens (execution.prefill_graph_tokens; the default 4,096), a fresh grid
# profiled in the same call with the same setting (so its prefill graph rows reach that size), each
# engine run priced at its measured host, step replays kept. Carry .whl and .traces.
#   GRAPH_TOKENS=16384 N=1000 bash experiments/fidelity/prefill_graphs_h200/call.sh   # on the GPU; writes $OUT
# Returns three files: small.tar.gz (heldout.csv, the fit, its validation, the hosts, run.log,
# gpu.txt), profile.csv.gz (the grid's rows) and steps.tar.gz (the replays; not committed).
set -euo pipefail
OUT=${OUT:?set OUT}
GRAPH_TOKENS=${GRAPH_TOKENS:?set GRAPH_TOKENS}
N=${N:-1000}
work=/tmp/pg$GRAPH_TOKENS
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L > "$work.gpu.txt" 2>&1 || true
OUT=$work MODEL=qwen3-0.6b WORKLOADS=code_completion LOADS=0.5,0.8,0.95 STEPS=1 NUM_REQUESTS=$N HARDWARE=h200 \
    EXTRA="fidelity.price_serving_host=true execution.prefill_graph_tokens=$GRAPH_TOKENS" WHEELS=.whl \
    BUDGET_S=${BUDGET_S:-540} bash experiments/fidelity/run_gpu.sh
M=$work/qwen3-0.6b
python3 -m experiments.fidelity.cause.host_scales "$M/code_completion/steps" "$M/profile_model.csv" --out "$M/host_scales"
cp "$work.gpu.txt" "$M/gpu.txt"
cp "$M/code_completion/heldout.csv" "$M/code_completion/run.log" "$M/"
tar -C "$M" -czf "$OUT/small.tar.gz" heldout.csv profile_model.csv validation.csv host_scales.csv host_scales_runs.csv run.log gpu.txt
gzip -c "$M/profile.csv" > "$OUT/profile.csv.gz"
tar -C "$M/code_completion" -czf "$OUT/steps.tar.gz" steps
ls -la "$OUT"
