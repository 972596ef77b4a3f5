#!/usr/bin/env bash
# Every committed cell of the held-out table (H100: 0.6B and 8B with their committed fits; H200:
# the 0.6B's own fit) and of code_completion_h200 priced again on the CPU with this checkout's
# model: point predictions, one CSV per group under $1; the cc_h100_* and cc_h200_r2_* groups are the
# code_completion calls the table holds (each engine run's measured host; the H200's own fit and the
# carried one), h200_again the second H200 conversation call. Before/after a model change:
#   bash experiments/fidelity/cause/resimulate_all.sh /tmp/before; (change); ... /tmp/after
#   python experiments/fidelity/cause/diff_cells.py /tmp/before /tmp/after
# A setting of resimulate.py for every group (the after side of a rule that is off by default):
#   EXTRA=--plan-after-launches bash experiments/fidelity/cause/resimulate_all.sh /tmp/after
set -euo pipefail
out=${1:?usage: resimulate_all.sh OUT_DIR [GROUP...]}; shift
groups=${*:-h100_06 h100_8b h200_06 h200_again cc_06_profiled cc_06_carried cc_8b_carried cc_h100_06 cc_h100_8b \
  cc_h200_r2_own cc_h200_r2_carried}
mkdir -p "$out"
R="env PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python experiments/fidelity/resimulate.py ${EXTRA:-}"
T=experiments/fidelity/heldout.csv.gz; D=experiments/fidelity/code_completion_h200
H=experiments/fidelity/code_completion_h100; Q=experiments/fidelity/code_completion_h200_r2/qwen3-0.6b
for g in $groups; do
  case $g in
    h100_06) $R $T experiments/fidelity/h100_leakfree/profile_model.csv --label profiled --model qwen3-0.6b \
               --hardware h100 --num-blocks 2422 --num-requests 80 --out "$out/$g.csv" ;;
    h100_8b) $R $T experiments/fidelity/h100_8b/qwen3-8b_grid_fit.csv --label profiled --model qwen3-8b \
               --hardware h100 --num-blocks 1450 --num-requests 60 \
               --workloads prefill_heavy,bursty,conversation,shared_prefix --out "$out/${g}_60.csv"
             $R $T experiments/fidelity/h100_8b/qwen3-8b_grid_fit.csv --label profiled --model qwen3-8b \
               --hardware h100 --num-blocks 1450 --num-requests 40 \
               --workloads decode_heavy,preempting_bench --out "$out/${g}_40.csv" ;;
    h200_06) $R $T profiles/h200/qwen3-0.6b.csv --label profiled --model qwen3-0.6b --hardware h200 \
               --num-blocks 4418 --num-requests 80 --workloads bursty,decode_heavy,conversation --out "$out/$g.csv" ;;
    cc_06_profiled) $R $D/qwen3-0.6b/heldout.csv profiles/h200/qwen3-0.6b.csv --label profiled --model qwen3-0.6b \
               --hardware h200 --num-blocks 4418 --num-requests 1000 --out "$out/$g.csv" ;;
    cc_06_carried) $R $D/qwen3-0.6b/heldout.csv experiments/fidelity/h200/qwen3-0.6b_from_h100.csv --label carried \
               --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1000 --out "$out/$g.csv" ;;
    cc_8b_carried) $R $D/qwen3-8b/heldout.csv experiments/fidelity/h200/qwen3-8b_from_h100.csv --label carried \
               --model qwen3-8b --hardware h200 --num-blocks 3002 --num-requests 250 --out "$out/$g.csv" ;;
    h200_again) $R experiments/fidelity/h200_conversation_again/heldout.csv profiles/h200/qwen3-0.6b.csv --label profiled \
               --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 80 --out "$out/$g.csv" ;;
    cc_h100_06) $R $H/qwen3-0.6b/heldout.csv experiments/fidelity/h100_leakfree/profile_model.csv --label profiled_run_host \
               --host-scales $H/qwen3-0.6b/host_scales_runs.csv --model qwen3-0.6b --hardware h100 --num-blocks 2422 \
               --num-requests 1000 --out "$out/$g.csv" ;;
    cc_h100_8b) $R $H/qwen3-8b/heldout.csv experiments/fidelity/h100_8b/qwen3-8b_grid_fit.csv --label profiled_run_host \
               --host-scales $H/qwen3-8b/host_scales_runs.csv --model qwen3-8b --hardware h100 --num-blocks 1450 \
               --num-requests 200 --out "$out/$g.csv" ;;
    cc_h200_r2_own) $R $Q/heldout.csv $Q/profile_model.csv --label profiled_run_host --host-scales $Q/host_scales_runs.csv \
               --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1500 --out "$out/$g.csv" ;;
    cc_h200_r2_carried) $R $Q/heldout.csv experiments/fidelity/h200/qwen3-0.6b_from_h100.csv --label carried \
               --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1500 --out "$out/$g.csv" ;;
    *) echo "unknown group $g" >&2; exit 2 ;;
  esac
done
