#!/usr/bin/env bash
# One device call of the held-out protocol (experiment=fidelity, issue 14) for one model and a
# group of workload classes; results (heldout.csv, heldout.png) under $OUT/<model>/<tag>/, the
# grid profile and its fit under $OUT/<model>/. Carry the Hydra wheels of ../shared/wheels (the
# folder WHEELS names: .whl by default; .hyd where a checkout keeps them alone there) and, for the
# conversation and code_completion classes (the trace's arrival times), .traces (azure_conv_2023.csv). A later call of the same model passes the
# first call's profile.csv as PROFILE (refitted here on its grid rows: no second profile).
# HARDWARE (conf/hardware, default h100) names the GPU the call runs on; CARRIED, a model fitted on
# another GPU and carried to it (transfer_model.py), adds the cost model "carried" to every cell.
#   OUT=$OUT MODEL=qwen3-0.6b WORKLOADS=prefill_heavy,bursty,shared_prefix bash experiments/fidelity/run_gpu.sh
#   OUT=$OUT MODEL=qwen3-0.6b WORKLOADS=decode_heavy,conversation,preempting_bench PROFILE=<copied profile.csv> ...
#   OUT=$OUT MODEL=qwen3-0.6b WORKLOADS=shared_prefix NUM_REQUESTS=80 WHEELS=.hyd bash experiments/fidelity/run_gpu.sh
#   OUT=$OUT HARDWARE=h200 CARRIED=experiments/fidelity/h200/qwen3-0.6b_from_h100.csv WORKLOADS=decode_heavy ...
#   OUT=$OUT LOADS=offline PROFILE=<profile.csv> ...   # offline cells alone: capacity and schedules.csv
#   STEPS=1 ...   # every engine run's steps priced by each cost model, under $OUT/<model>/<tag>/steps/
# then, without a GPU: python experiments/fidelity/merge.py <the calls' heldout.csv files>
set -euo pipefail
OUT=${OUT:?set OUT}
MODEL=${MODEL:-qwen3-0.6b}
CLASSES=prefill_heavy,decode_heavy,conversation,bursty,shared_prefix,preempting_bench,code_completion
WORKLOADS=${WORKLOADS:-$CLASSES}
NUM_REQUESTS=${NUM_REQUESTS:-100}
LOADS=${LOADS:-0.5,0.8,0.95}
[ "$LOADS" = offline ] && LOADS=""  # fidelity.loads=[]: no load cells
PROFILE=${PROFILE:-null}
HARDWARE=${HARDWARE:-h100}
CARRIED=${CARRIED:-null}
STEPS=${STEPS:-}
WHEELS=${WHEELS:-.whl}
TAG=${TAG:-$(echo "$WORKLOADS" | tr ',' '-')}
case $MODEL in
  qwen3-0.6b|qwen3-8b) CK=/tmp/ck/$MODEL;;
  *) echo "MODEL must be qwen3-0.6b or qwen3-8b, got $MODEL" >&2; exit 2;;
esac
for w in ${WORKLOADS//,/ }; do
  case ",$CLASSES," in *,"$w",*) ;; *) echo "WORKLOADS: unknown class $w; known: $CLASSES" >&2; exit 2;; esac
done
case ",$WORKLOADS," in
  *,conversation,*|*,code_completion,*)
    [ -f .traces/azure_conv_2023.csv ] || { echo "$WORKLOADS needs .traces/azure_conv_2023.csv: carry .traces" >&2; exit 2; };;
esac
ls "$WHEELS"/hydra_core-*.whl > /dev/null 2>&1 || { echo "WHEELS=$WHEELS holds no hydra_core wheel: carry it" >&2; exit 2; }
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
# installed once per machine: calls side by side (code_completion_gpu.sh) must not both write /tmp/site
python3 -c "import hydra, omegaconf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl
[ -f "$CK/config.json" ] || python3 -m engine.checkpoint --preset "$MODEL" --out "$CK" --dtype bfloat16 > /dev/null
RUN=/tmp/fidelity_run/$MODEL/$TAG
# workload.trace_path is read from the cwd
[ -f .traces/azure_conv_2023.csv ] && cp .traces/azure_conv_2023.csv .
mkdir -p "$OUT/$MODEL/$TAG"
STEPS_DIR=null
[ -n "$STEPS" ] && STEPS_DIR=$OUT/$MODEL/$TAG/steps
# max_model_len 16,384: above the prefill-heavy class's 10,240, so the grid's long chunks after
# 12k of cached context are profiled too (harness.calibration.profiling.ProfileGrid.long_prefill_*)
python3 -m harness experiment=fidelity model=$MODEL hardware=$HARDWARE backend.model=$CK \
    scheduler.max_model_len=16384 "fidelity.workloads=[$WORKLOADS]" \
    "fidelity.loads=[$LOADS]" fidelity.num_requests=$NUM_REQUESTS fidelity.profile_path=$PROFILE \
    fidelity.carried_profile_path=$CARRIED fidelity.steps_dir=$STEPS_DIR \
    fidelity.results_dir=$OUT/$MODEL/$TAG hydra.run.dir=$RUN output.progress=false 2>&1 | tee "$OUT/$MODEL/$TAG/run.log"
for f in profile.csv profile_model.csv validation.csv; do
  [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/$MODEL/"
done
echo "done: $OUT/$MODEL/$TAG"
