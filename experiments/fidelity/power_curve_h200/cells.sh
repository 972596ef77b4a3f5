#!/usr/bin/env bash
# The H200 code_completion samples (Qwen3-0.6B, 1,500 requests a cell, each engine run at its measured
# host) priced again on the CPU without and with the GPU's power curve (backend.power_curve,
# sim.power_limit): r2 (its own fit), r3's two calls, r4, r6 and r7 (r2's fit), r5 (its own fit). One CSV per
# sample and side under $1, then summary.py's table (r7: served with the clock sampled). Curve: $CURVE (default the shipped one).
#   bash experiments/fidelity/power_curve_h200/cells.sh /tmp/power_cells
set -euo pipefail
out=${1:?usage: cells.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
F=experiments/fidelity; CURVE=${CURVE:-profiles/h200/qwen3-0.6b.power.json}
R="python $F/resimulate.py"; C="--label profiled_run_host --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1500"
P2=$F/code_completion_h200_r2/qwen3-0.6b/profile_model.csv
run() {  # sample table fit hosts
  $R "$2" "$3" $C --host-scales "$4" --out "$out/$1_without.csv" >/dev/null
  $R "$2" "$3" $C --host-scales "$4" --power-curve "$CURVE" --out "$out/$1_with.csv" >/dev/null
}
run r2 $F/code_completion_h200_r2/qwen3-0.6b/heldout.csv $P2 $F/code_completion_h200_r2/qwen3-0.6b/host_scales_runs.csv
for c in 1 2; do
  run r3_call$c $F/code_completion_h200_r3/heldout_call$c.csv.gz $P2 $F/code_completion_h200_r3/host_scales_runs.csv
done
run r4 $F/code_completion_h200_r4/heldout.csv.gz $P2 $F/code_completion_h200_r4/host_scales_runs.csv
run r6 $F/code_completion_h200_r6/heldout.csv.gz $P2 $F/code_completion_h200_r6/host_scales_runs.csv
run r7 $F/code_completion_h200_r7/heldout.csv.gz $P2 $F/code_completion_h200_r7/host_scales_runs.csv
run r5 $F/code_completion_h200_r5/heldout.csv.gz $F/code_completion_h200_r5/profile_model.csv.gz \
    $F/code_completion_h200_r5/host_scales_runs.csv
python -m experiments.fidelity.power_curve_h200.summary "$out" --out "$out/summary.csv"
