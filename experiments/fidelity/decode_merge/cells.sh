#!/usr/bin/env bash
# The decode kernel's merge of split partials (backend.decode_merge, sim/decode_merge.py) weighed on
# committed cells: the two committed raw grids (H200 r2's, H100 leak-free's) fitted without and with
# the merge term by one grid-only fit (refit_merge.py), then the Qwen3-0.6B code_completion samples
# priced by each (H200 r2, r3's calls, r4, r5 with r2's grid; the H100 call; each engine run at its
# measured host) and the H100 held-out table's 0.6B cells. CSVs under $1, summary.py's table for the
# samples, diff_cells.py's for the table.
#   bash experiments/fidelity/decode_merge/cells.sh /tmp/merge_cells
set -euo pipefail
out=${1:?usage: cells.sh OUT_DIR}
mkdir -p "$out/table_plain" "$out/table_merge"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
F=experiments/fidelity; R="python $F/resimulate.py"
G2=$F/code_completion_h200_r2/qwen3-0.6b; GH=$F/h100_leakfree
python -m experiments.fidelity.refit_merge $G2/profile.csv.gz --model qwen3-0.6b --hardware h200 \
    --out-merge "$out/h200_merge.csv" --out-plain "$out/h200_plain.csv"
python -m experiments.fidelity.refit_merge $GH/profile.csv.gz --model qwen3-0.6b --hardware h100 \
    --out-merge "$out/h100_merge.csv" --out-plain "$out/h100_plain.csv"
C2="--label profiled_run_host --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1500"
run() {  # sample table hosts gpu flags
  $R "$2" "$out/$4_plain.csv" ${5:-$C2} --host-scales "$3" --out "$out/$1_without.csv" >/dev/null
  $R "$2" "$out/$4_merge.csv" ${5:-$C2} --host-scales "$3" --out "$out/$1_with.csv" >/dev/null
}
run r2 $G2/heldout.csv $G2/host_scales_runs.csv h200
for c in 1 2; do run r3_call$c $F/code_completion_h200_r3/heldout_call$c.csv.gz $F/code_completion_h200_r3/host_scales_runs.csv h200; done
run r4 $F/code_completion_h200_r4/heldout.csv.gz $F/code_completion_h200_r4/host_scales_runs.csv h200
run r5 $F/code_completion_h200_r5/heldout.csv.gz $F/code_completion_h200_r5/host_scales_r2fit_runs.csv h200
H=$F/code_completion_h100/qwen3-0.6b
run h100 $H/heldout.csv $H/host_scales_runs.csv h100 \
    "--label profiled_run_host --model qwen3-0.6b --hardware h100 --num-blocks 2422 --num-requests 1000"
python -m experiments.fidelity.power_curve_h200.summary "$out" --out "$out/summary.csv"
S06="--label profiled --model qwen3-0.6b --hardware h100 --num-blocks 2422 --num-requests 80"
for side in plain merge; do
  $R $F/heldout.csv.gz "$out/h100_$side.csv" $S06 --out "$out/table_$side/h100_06.csv" >/dev/null
done
python $F/cause/diff_cells.py "$out/table_plain" "$out/table_merge"
