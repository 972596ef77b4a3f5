#!/usr/bin/env bash
# How much a model-and-load group's coverage moves with the interval's draws: one model's profiled
# cells (the rebuild_table.sh commands for them) simulated again with other seeds of the interval's
# 19 draws (their run factors stratified, sim/interval.py), each seed's table merged over the
# committed one (merge.py: SCRATCH/s<seed>/table), then per seed and group the conformal coverage and
# median width (interval_seeds_summary.py; OUT: its CSV, whose rows of other models and tables stay).
# Every cell with the idle start as the held-out protocol prices it (rebuild_table.sh's --idle-start auto).
# MODEL: qwen3-8b (default: its H100 cells) or qwen3-0.6b (its H100 cells and its H200 cells with
# the H200's own fit, code_completion at the grid's and at each run's host; the fits P06, PH200,
# QFIT as rebuild_table.sh's). SPREAD (optional): the machine factor's half-width instead of the
# model's (0.016: the 8B's before the step-time floor).
#   OUT=experiments/fidelity/interval_seeds.csv bash experiments/fidelity/interval_seeds.sh /tmp/seeds 0 1 2 3 4 5 6 7 8
#   SPREAD=0.016 bash experiments/fidelity/interval_seeds.sh /tmp/seeds_spread 0 1 2 3 4 5 6 7 8
#   MODEL=qwen3-0.6b OUT=experiments/fidelity/interval_seeds.csv bash experiments/fidelity/interval_seeds.sh /tmp/seeds06 0 1 2
set -euo pipefail
out=${1:?usage: interval_seeds.sh SCRATCH_DIR SEED...}; shift
MODEL=${MODEL:-qwen3-8b}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
F=experiments/fidelity; H=$F/code_completion_h100
M="python -m experiments.fidelity.merge"

seed_8b() {  # seed, its scratch directory
  local t=$2 P8=$F/h100_8b/qwen3-8b_grid_fit.csv S8="--model qwen3-8b --hardware h100 --num-blocks 1450 --label profiled"
  [ -f "$out/heldout_before_8b_pool.csv" ] || git show 44e4032^:experiments/fidelity/heldout.csv > "$out/heldout_before_8b_pool.csv"
  $R $F/heldout.csv.gz $P8 $S8 --num-requests 60 --workloads prefill_heavy,bursty,conversation,shared_prefix --out $t/8b_60.csv >/dev/null
  $R $F/heldout.csv.gz $P8 $S8 --num-requests 40 --workloads decode_heavy,preempting_bench --out $t/8b_40.csv >/dev/null
  $R "$out/heldout_before_8b_pool.csv" $P8 $S8 --num-requests 60 --workloads prefill_heavy --out $t/8b_prefill_first.csv >/dev/null
  for c in 1 2; do
    $R $F/h100_8b_prefill_again/heldout_call$c.csv $P8 $S8 --num-requests 60 --out $t/8b_prefill_again_$c.csv >/dev/null; done
  $M $t/8b_prefill_first.csv --pool $t/8b_prefill_again_{1,2}.csv --out $t/pool8b >/dev/null
  $R $H/qwen3-8b/heldout.csv $P8 $S8 --num-requests 200 --out $t/cc.csv >/dev/null
  $R $H/qwen3-8b/heldout.csv $P8 ${S8/profiled/profiled_run_host} --num-requests 200 \
      --host-scales $H/qwen3-8b/host_scales_runs.csv --out $t/cc_host.csv >/dev/null
  $M $F/heldout.csv.gz $t/8b_60.csv $t/8b_40.csv $t/pool8b/heldout.csv $t/cc.csv $t/cc_host.csv --out $t/table >/dev/null
}

seed_06() {  # seed, its scratch directory: rebuild_table.sh's 0.6B pools, in its order
  local t=$2 P06=${P06:-$F/h100_leakfree/profile_model.csv} PH200=${PH200:-profiles/h200/qwen3-0.6b.csv}
  local D=$F/code_completion_h200_r2/qwen3-0.6b; local QFIT=${QFIT:-$D/profile_model.csv}
  local S06="--model qwen3-0.6b --hardware h100 --num-blocks 2422 --label profiled"
  local SH200="--model qwen3-0.6b --hardware h200 --num-blocks 4418 --label profiled"
  $R $F/h100_leakfree/heldout.csv.gz $P06 $S06 --num-requests 80 \
      --workloads prefill_heavy,bursty,decode_heavy,conversation,shared_prefix --out $t/06_leakfree.csv >/dev/null
  for w in decode_heavy-conversation-bursty prefill_heavy-shared_prefix-preempting_bench; do
    $R $F/h100_second_lease/heldout_$w.csv.gz $P06 $S06 --num-requests 80 --out $t/06_second_$w.csv >/dev/null; done
  for c in 1 3; do
    $R $F/h100_third_lease/heldout_call${c}_committed_fit.csv.gz $P06 $S06 --num-requests 80 --out $t/06_third_$c.csv >/dev/null; done
  $R $F/h100_fourth_lease/heldout.csv.gz $P06 $S06 --num-requests 80 --out $t/06_fourth.csv >/dev/null
  $M $t/06_leakfree.csv --pool $t/06_second_*.csv --out $t/pool06_1 >/dev/null
  $M $t/pool06_1/heldout.csv --pool $t/06_third_{1,3}.csv --out $t/pool06_2 >/dev/null
  $M $t/pool06_2/heldout.csv --pool $t/06_fourth.csv --out $t/pool06 >/dev/null
  $R $F/h200/device_calls.csv.gz $PH200 $SH200 --num-requests 80 --out $t/h200_first.csv >/dev/null
  $R $F/h200_conversation_again/heldout.csv $PH200 $SH200 --num-requests 80 --out $t/h200_again.csv >/dev/null
  $M $t/h200_first.csv --pool $t/h200_again.csv --out $t/poolh200 >/dev/null
  $R $H/qwen3-0.6b/heldout.csv $P06 $S06 --num-requests 1000 --out $t/cc06.csv >/dev/null
  $R $H/qwen3-0.6b/heldout.csv $P06 ${S06/profiled/profiled_run_host} --num-requests 1000 \
      --host-scales $H/qwen3-0.6b/host_scales_runs.csv --out $t/cc06_host.csv >/dev/null
  $R $D/heldout.csv $QFIT $SH200 --num-requests 1500 --out $t/cch200.csv >/dev/null
  $R $D/heldout.csv $QFIT ${SH200/profiled/profiled_run_host} --num-requests 1500 \
      --host-scales $D/host_scales_runs.csv --out $t/cch200_host.csv >/dev/null
  $M $F/heldout.csv.gz $t/pool06/heldout.csv $t/poolh200/heldout.csv $t/cc06.csv $t/cch200.csv \
      $t/cc06_host.csv $t/cch200_host.csv --out $t/table >/dev/null
}

case $MODEL in
  qwen3-8b) simulate=seed_8b ;;
  qwen3-0.6b) simulate=seed_06 ;;
  *) echo "interval_seeds.sh: MODEL must be qwen3-8b or qwen3-0.6b, not $MODEL" >&2; exit 2 ;;
esac
mkdir -p "$out"
for seed in "$@"; do
  R="python -m experiments.fidelity.resimulate --idle-start auto --interval --interval-seed $seed ${SPREAD:+--machine-spread $SPREAD}"
  $simulate "$seed" "$out/s$seed"
done
# per seed and group of the model: cells inside, coverage and median width (interval_seeds_summary.py)
python -m experiments.fidelity.interval_seeds_summary --model "$MODEL" ${OUT:+--out $OUT --append} \
    $(for seed in "$@"; do echo "s$seed=$out/s$seed/table/heldout.csv"; done)
