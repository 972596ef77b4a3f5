#!/usr/bin/env bash
# Leave one workload out (no GPU): for each target workload W of a run folder, refit the profiled
# model on the grid, the calibration run AND the recorded engine steps of the other two target
# workloads, then compare W again against its saved engine run. Shows what calibrating on real
# online steps buys over the offline calibration run alone; W's own steps are never fitted.
#   bash experiments/calibration/lowo.sh experiments/calibration/h100_run2/qwen3_0_6b
set -eu
export PYTHONPATH=.
RUN=$1
for w in bench poisson azure; do
  others=()
  for o in bench poisson azure; do [ "$o" = "$w" ] || others+=("$RUN/compare_$o/engine/steps.csv"); done
  python experiments/calibration/refit.py "$RUN" --out "$RUN/lowo/$w" --extra-steps "${others[@]}" > /dev/null
  python experiments/calibration/recompare.py "$RUN" --profile "$RUN/lowo/$w/model.csv" --out "$RUN/lowo/$w" \
      --only "compare_$w" 2> /dev/null | grep -v "^ *replay_step\|^metric" 
done
find "$RUN/lowo" -path "*sim_*" -name steps.csv -delete
