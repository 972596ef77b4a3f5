#!/usr/bin/env bash
# The held-out table rebuilt on the CPU with this checkout's model: every call's profiled cells
# simulated again with the committed fit of its model and GPU (resimulate.py, with the interval),
# pooled as the table pools them (merge.py --pool, in the order the calls were pooled: a pool's
# engine_spread depends on it), the carried H200 rows over the table's cells, the code_completion
# calls at the grid's host and at each run's measured host; then merge.py writes heldout.csv (gzipped after), its
# plots, coverage, targets and interval_margins.csv into experiments/fidelity. The engine side and
# the roofline rows stay the calls' own (no step price in them). Scratch tables under $1.
#   bash experiments/fidelity/rebuild_table.sh /tmp/rebuild
#   F=experiments/fidelity; Q=$F/code_completion_h200_r2/qwen3-0.6b/profile_model_programs.csv.gz
#   P06=$F/h100_leakfree/profile_model_programs.csv.gz PH200=$Q QFIT=$Q bash $F/rebuild_table.sh /tmp/rebuild
# The Qwen3-8B cells the table holds from its first calls exist only in the table (their calls'
# tables were not kept); they are simulated from it, and the prefill-heavy cells pooled since from
# the table before that pool (git show 44e4032^).
set -euo pipefail
tmp=${1:?usage: rebuild_table.sh SCRATCH_DIR}
mkdir -p "$tmp"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# every cell with the idle start as the protocol prices it (fidelity.idle_start: where the GPU host measured
# it, for a profile without lead fits): the H200 fit's cells; the H100 has no figure, lead fits price it
# RESIM_FLAGS: more resimulate.py flags for every cell, to weigh a model change on the whole table, e.g.
#   RESIM_FLAGS="--decode-programs-per-sm 5 --decode-programs-baseline grid_waves" (in a scratch worktree:
#   the script writes the committed tables)
F=experiments/fidelity; R="python -m experiments.fidelity.resimulate --idle-start auto ${RESIM_FLAGS:-}"; M="python -m experiments.fidelity.merge"
# the fits (each may be given in the environment instead: the same table with other fits, e.g. the
# grids' fits with the prefill kernel's programs, docs/prefill-programs.md; QFIT: the code_completion
# H200 call's own fit)
P06=${P06:-$F/h100_leakfree/profile_model.csv}; P8=${P8:-$F/h100_8b/qwen3-8b_grid_fit.csv}
PH200=${PH200:-profiles/h200/qwen3-0.6b.csv}; C06=${C06:-$F/h200/qwen3-0.6b_from_h100.csv}
# POWER=1: every cell priced at its GPU's power limit (backend.power_curve) with the shipped H200 curve of
# its model, which prices the H100 SXM too (the same die at the same limit, sim.power_limit)
curve() { if [ "${POWER:-0}" = 1 ]; then echo "--power-curve profiles/h200/$1.power.json"; fi; }
S06="--model qwen3-0.6b --hardware h100 --num-blocks 2422 --num-requests 80 $(curve qwen3-0.6b)"
S8="--model qwen3-8b --hardware h100 --num-blocks 1450 $(curve qwen3-8b)"
SH200="--model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 80 $(curve qwen3-0.6b)"

# Qwen3-0.6B on the H100: the leak-free call and the second lease pooled, then the third lease's
# shared-prefix calls, then the fourth's (the preempting bench: the second lease's re-sized class)
$R $F/h100_leakfree/heldout.csv.gz $P06 --label profiled --interval $S06 \
    --workloads prefill_heavy,bursty,decode_heavy,conversation,shared_prefix --out "$tmp/06_leakfree.csv"
for t in decode_heavy-conversation-bursty prefill_heavy-shared_prefix-preempting_bench; do
  $R $F/h100_second_lease/heldout_$t.csv.gz $P06 --label profiled --interval $S06 --out "$tmp/06_second_$t.csv"; done
for c in 1 3; do
  $R $F/h100_third_lease/heldout_call${c}_committed_fit.csv.gz $P06 --label profiled --interval $S06 --out "$tmp/06_third_$c.csv"; done
$R $F/h100_fourth_lease/heldout.csv.gz $P06 --label profiled --interval $S06 --out "$tmp/06_fourth.csv"
$M "$tmp/06_leakfree.csv" --pool "$tmp"/06_second_*.csv --out "$tmp/pool06_1" >/dev/null
$M "$tmp/pool06_1/heldout.csv" --pool "$tmp"/06_third_{1,3}.csv --out "$tmp/pool06_2" >/dev/null
$M "$tmp/pool06_2/heldout.csv" --pool "$tmp/06_fourth.csv" --out "$tmp/pool06" >/dev/null

# Qwen3-8B on the H100: 60 requests a cell, 40 for decode-heavy and the preempting bench; the
# prefill-heavy cells at 80% and offline pooled over three calls
$R $F/heldout.csv.gz $P8 --label profiled --interval $S8 --num-requests 60 \
    --workloads prefill_heavy,bursty,conversation,shared_prefix --out "$tmp/8b_60.csv"
$R $F/heldout.csv.gz $P8 --label profiled --interval $S8 --num-requests 40 \
    --workloads decode_heavy,preempting_bench --out "$tmp/8b_40.csv"
git show 44e4032^:experiments/fidelity/heldout.csv > "$tmp/heldout_before_8b_pool.csv"
$R "$tmp/heldout_before_8b_pool.csv" $P8 --label profiled --interval $S8 --num-requests 60 \
    --workloads prefill_heavy --out "$tmp/8b_prefill_first.csv"
for c in 1 2; do
  $R $F/h100_8b_prefill_again/heldout_call$c.csv $P8 --label profiled --interval $S8 --num-requests 60 \
      --out "$tmp/8b_prefill_again_$c.csv"; done
$M "$tmp/8b_prefill_first.csv" --pool "$tmp"/8b_prefill_again_{1,2}.csv --out "$tmp/pool8b" >/dev/null

# Qwen3-0.6B on the H200: its own fit, the conversation cells of two calls pooled; the H100 fit
# carried, over the table's cells (h200/carried.csv, points only)
$R $F/h200/device_calls.csv.gz $PH200 --label profiled --interval $SH200 --out "$tmp/h200_first.csv"
$R $F/h200_conversation_again/heldout.csv $PH200 --label profiled --interval $SH200 --out "$tmp/h200_again.csv"
$M "$tmp/h200_first.csv" --pool "$tmp/h200_again.csv" --out "$tmp/poolh200" >/dev/null
$R $F/heldout.csv.gz $C06 --label carried $SH200 --workloads bursty,decode_heavy,conversation \
    --out $F/h200/carried.csv

# code_completion: the H100 call (each run's host: code_completion_h100/*/host_scales_runs.csv) and
# the H200 call (code_completion_h200_r2: its own fit, the H100 fit carried)
H=$F/code_completion_h100; S="--model qwen3-0.6b --hardware h100 --num-blocks 2422 --num-requests 1000 $(curve qwen3-0.6b)"
$R $H/qwen3-0.6b/heldout.csv $P06 --label profiled --interval $S --out $H/resimulated/qwen3-0.6b_profiled.csv.gz
$R $H/qwen3-0.6b/heldout.csv $P06 --label profiled_run_host --interval --host-scales $H/qwen3-0.6b/host_scales_runs.csv \
    $S --out $H/resimulated/qwen3-0.6b_profiled_run_host.csv.gz
$R $H/qwen3-0.6b/heldout.csv $P06 --label profiled_run_host_jitter --interval --host-scales $H/qwen3-0.6b/host_scales_runs.csv \
    --host-jitter $S --out $H/resimulated/qwen3-0.6b_profiled_run_host_jitter.csv.gz
S="$S8 --num-requests 200"
$R $H/qwen3-8b/heldout.csv $P8 --label profiled --interval $S --out $H/resimulated/qwen3-8b_profiled.csv.gz
$R $H/qwen3-8b/heldout.csv $P8 --label profiled_run_host --interval --host-scales $H/qwen3-8b/host_scales_runs.csv \
    $S --out $H/resimulated/qwen3-8b_profiled_run_host.csv.gz
D=$F/code_completion_h200_r2; Q=$D/qwen3-0.6b; QFIT=${QFIT:-$Q/profile_model.csv}; S="--model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1500 $(curve qwen3-0.6b)"
$R $Q/heldout.csv $QFIT --label profiled --interval $S --out $D/resimulated/qwen3-0.6b_profiled.csv.gz
$R $Q/heldout.csv $QFIT --label profiled_run_host --interval --host-scales $Q/host_scales_runs.csv \
    $S --out $D/resimulated/qwen3-0.6b_profiled_run_host.csv.gz
$R $Q/heldout.csv $QFIT --label profiled_run_host_jitter --interval --host-scales $Q/host_scales_runs.csv \
    --host-jitter $S --out $D/resimulated/qwen3-0.6b_profiled_run_host_jitter.csv.gz
$R $Q/heldout.csv $C06 --label carried --interval $S --out $D/resimulated/qwen3-0.6b_carried.csv.gz
$R $Q/heldout.csv $C06 --label carried_run_host --interval --host-scales $Q/host_scales_carried_runs.csv $S \
    --out $D/resimulated/qwen3-0.6b_carried_run_host.csv.gz

# every group into the table, later tables replacing earlier rows: the pooled cells after the
# table-wide 8B rows; the code_completion cells at the grid's host before those at the measured host
# (merge.py keeps the former beside the latter as profiled_grid_host)
$M $F/heldout.csv.gz "$tmp/pool06/heldout.csv" "$tmp/8b_60.csv" "$tmp/8b_40.csv" "$tmp/pool8b/heldout.csv" \
    "$tmp/poolh200/heldout.csv" $F/h200/carried.csv \
    $H/resimulated/qwen3-0.6b_profiled.csv.gz $H/resimulated/qwen3-8b_profiled.csv.gz \
    $D/resimulated/qwen3-0.6b_profiled.csv.gz $D/resimulated/qwen3-0.6b_carried.csv.gz \
    $H/resimulated/qwen3-0.6b_profiled_run_host.csv.gz $H/resimulated/qwen3-8b_profiled_run_host.csv.gz \
    $D/resimulated/qwen3-0.6b_profiled_run_host.csv.gz
# the table is committed gzipped (the repository's size bound): the new one replaces it
gzip -9 -n -f $F/heldout.csv
