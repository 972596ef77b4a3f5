#!/usr/bin/env bash
# Every committed comparison priced with the H200 Qwen3-0.6B profile, re-simulated on the CPU with
# two fits side by side (the shipped one against another grid's), then tabulated by
# h200_fit_choice.py: per comparison, how many of its cells are within target with each fit.
#   bash experiments/fidelity/h200_fit_choice.sh SCRATCH OLD_FIT NEW_FIT
#   e.g. ... /tmp/fits profiles/h200/qwen3-0.6b.csv experiments/fidelity/code_completion_h200_r2/qwen3-0.6b/profile_model.csv
# The comparisons: the held-out table's H200 cells (own fit, the conversation calls pooled as the
# table pools them), the two H200 code_completion calls at the grid's host (and the second at each
# run's measured host, a host measured against the new fit only: its replays are not kept), the
# two-replica fleet (experiments/fleet/h200x2_run2), the mid-run starts (experiments/autoscale/
# h200_run1-3, the start-up as run), every disaggregated H200 call (both fleets, decode programs on).
# Today's model on both sides; about 25 minutes on two cores.
set -euo pipefail
out=${1:?usage: h200_fit_choice.sh SCRATCH OLD_FIT NEW_FIT}
old=$(realpath "${2:?old fit}"); new=$(realpath "${3:?new fit}")
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
F=experiments/fidelity; R="python -m experiments.fidelity.resimulate"; M="python -m experiments.fidelity.merge"
SH200="--model qwen3-0.6b --hardware h200 --num-blocks 4418"
Q=$F/code_completion_h200_r2/qwen3-0.6b
mkdir -p "$out"
cp "$old" "$out/old.csv"; cp "$new" "$out/new.csv"
[ -f "$out/azure_conv_2023.csv" ] || cp ../shared/traces/azure_conv_2023.csv "$out/"

# the two-replica fleet: simulate_dp.sh's runs, into the scratch folder
fleet() {  # fit
  local run=experiments/fleet/h200x2_run2 sims="$out/$1/fleet" rate router name
  # shellcheck source=experiments/fleet/dp_common.sh
  source experiments/fleet/dp_common.sh
  rate=$(python -c "import re; print(re.search(r'rate ([0-9.]+)', open('$run/rate.txt').read()).group(1))")
  for router in round_robin least_requests; do for name in poisson trace; do
    # shellcheck disable=SC2046
    python -m harness $COMMON fleet.replicas=2 router=$router \
        $(workload_of "$name" "$rate" | sed "s#trace_path=azure_conv_2023.csv#trace_path=$out/azure_conv_2023.csv#") \
        backend.cost_model=profiled backend.profile_path="$out/$1.csv" hydra.run.dir="$out/$1/runs/${name}_$router" >/dev/null
    mkdir -p "$sims/sim_${name}_$router"; cp "$out/$1/runs/${name}_$router/summary.csv" "$sims/sim_${name}_$router/"
  done; done
  python experiments/fleet/compare_fleet.py $run --sims "$sims" >/dev/null
}

for fit in old new; do
  P="$out/$fit.csv"; O="$out/$fit"; mkdir -p "$O/disagg" "$O/midrun"
  $R $F/h200/device_calls.csv.gz "$P" --label profiled --interval $SH200 --num-requests 80 --out "$O/h200_first.csv"
  $R $F/h200_conversation_again/heldout.csv "$P" --label profiled --interval $SH200 --num-requests 80 --out "$O/h200_again.csv"
  $M "$O/h200_first.csv" --pool "$O/h200_again.csv" --out "$O/heldout_h200" >/dev/null
  $R $Q/heldout.csv "$P" --label profiled $SH200 --num-requests 1500 --out "$O/cc2_grid_host.csv"
  $R $F/code_completion_h200/qwen3-0.6b/heldout.csv "$P" --label profiled $SH200 --num-requests 1000 \
      --out "$O/cc1_grid_host.csv"
  fleet $fit
  for r in 1 2 3; do
    python -m experiments.autoscale.midrun_rerun --run experiments/autoscale/h200_run$r --pricings as_run \
        --profile "$P" --out "$O/midrun/run$r" >/dev/null
  done
  for run in experiments/disagg/h200_run1 experiments/disagg/h200x4_pd_mixes/measure_{1P3D,2P2D,3P1D_u08} \
             experiments/disagg/h200x4_pd_mixes/run2/measure_{3P1D,2P2D}; do
    name=${run#experiments/disagg/}; name=${name//\//_}
    python -m experiments.disagg.h200_run1.resim --run "$run" --aggregated --set backend.decode_programs=true \
        --profile "$P" --out "$O/disagg/$name.csv" > "$O/disagg/$name.log"
  done
done
# the runs' hosts were measured against the r2 grid's fit (cause/host_scales.py on its replays)
if cmp -s "$out/new.csv" $Q/profile_model.csv; then
  $R $Q/heldout.csv "$out/new.csv" --label profiled $SH200 --num-requests 1500 \
      --host-scales $Q/host_scales_runs.csv --out "$out/new/cc2_run_host.csv"
fi
python experiments/fidelity/h200_fit_choice.py "$out"
