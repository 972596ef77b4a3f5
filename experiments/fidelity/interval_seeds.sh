#!/usr/bin/env bash
# How much a model-and-load group's coverage moves with the interval's draws: Qwen3-8B's H100 cells
# (the rebuild_table.sh commands for them) simulated again with other seeds of the interval's 19
# draws (their run factors stratified, sim/interval.py), each seed's table merged over the committed
# one (merge.py: SCRATCH/s<seed>/table), then per seed and group the conformal coverage and median
# width (interval_seeds_summary.py; OUT: its CSV). SPREAD (optional): the machine factor's
# half-width instead of the model's (0.016: the 8B's before the step-time floor).
#   OUT=experiments/fidelity/interval_seeds.csv bash experiments/fidelity/interval_seeds.sh /tmp/seeds 0 1 2 3 4 5 6 7 8
#   SPREAD=0.016 bash experiments/fidelity/interval_seeds.sh /tmp/seeds_spread 0 1 2 3 4 5 6 7 8
set -euo pipefail
out=${1:?usage: interval_seeds.sh SCRATCH_DIR SEED...}; shift
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
F=experiments/fidelity; H=$F/code_completion_h100; P8=$F/h100_8b/qwen3-8b_grid_fit.csv
M="python -m experiments.fidelity.merge"
mkdir -p "$out"; git show 44e4032^:experiments/fidelity/heldout.csv > "$out/heldout_before_8b_pool.csv"
for seed in "$@"; do
  t=$out/s$seed
  R="python -m experiments.fidelity.resimulate --interval --interval-seed $seed ${SPREAD:+--machine-spread $SPREAD}"
  S8="--model qwen3-8b --hardware h100 --num-blocks 1450 --label profiled"
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
done
# per seed and 8B group: cells inside, coverage and median width (interval_seeds_summary.py; OUT: its CSV)
python -m experiments.fidelity.interval_seeds_summary --model qwen3-8b ${OUT:+--out $OUT} \
    $(for seed in "$@"; do echo "s$seed=$out/s$seed/table/heldout.csv"; done)
