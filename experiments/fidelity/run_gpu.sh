#!/usr/bin/env bash
# One device call of the held-out protocol (experiment=fidelity, issue 14) for one model and a
# group of workload classes; results (heldout.csv, heldout.png) under $OUT/<model>/<tag>/, the
# grid profile and its fit under $OUT/<model>/. Carry the Hydra wheels of ../shared/wheels (the
# folder WHEELS names: .whl by default; .hyd where a checkout keeps them alone there) and, for the
# conversation and code_completion classes (the trace's arrival times), .traces (azure_conv_2023.csv). A later call of the same model passes the
# first call's profile.csv as PROFILE (refitted here on its grid rows: no second profile).
# HARDWARE (conf/hardware, default: the GPU's, h100 or h200) names the GPU the call runs on; CARRIED, a model fitted on
# another GPU and carried to it (transfer_model.py), adds the cost model "carried" to every cell.
#   OUT=$OUT MODEL=qwen3-0.6b WORKLOADS=prefill_heavy,bursty,shared_prefix bash experiments/fidelity/run_gpu.sh
#   OUT=$OUT MODEL=qwen3-0.6b WORKLOADS=decode_heavy,conversation,preempting_bench PROFILE=<copied profile.csv> ...
#   OUT=$OUT MODEL=qwen3-0.6b WORKLOADS=shared_prefix NUM_REQUESTS=80 WHEELS=.hyd bash experiments/fidelity/run_gpu.sh
#   OUT=$OUT HARDWARE=h200 CARRIED=experiments/fidelity/h200/qwen3-0.6b_from_h100.csv WORKLOADS=decode_heavy ...
#   OUT=$OUT LOADS=offline PROFILE=<profile.csv> ...   # offline cells alone: capacity and schedules.csv
#   STEPS=1 ...   # every engine run's steps priced by each cost model, under $OUT/<model>/<tag>/steps/
#   OUT=$OUT MODEL=qwen3-30b-a3b WORKLOADS=prefill_heavy,shared_prefix,conversation NUM_REQUESTS=40 LOADS=0.5,0.8 \
#       BUDGET_S=570 bash experiments/fidelity/run_gpu.sh   # MoE: random weights made on the GPU (no checkpoint),
#       # the routing skew measured on the grid (expert_counts.csv beside the profile; harness.fidelity.routing)
# BUDGET_S stops the harness after that many seconds and still copies what it wrote (a class's rows
# reach heldout.csv as it finishes). HARDWARE defaults to the GPU's (h100 or h200).
# The same on CPU, end to end (tests/harness/test_fidelity_moe.py): MODEL=tiny-qwen3-moe HARDWARE=cpu
# WHEELS=none MAX_MODEL_LEN=512 EXTRA="backend.device=cpu fidelity.length_scale=0.0625 fidelity.grid=quick ..."
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
SKEW=${SKEW:-null}
LOCALITY=${LOCALITY:-null}  # MoE: how alike a sequence's tokens route; null: fitted to the grid's per-step counts, else 0
MAX_MODEL_LEN=${MAX_MODEL_LEN:-16384}
EXTRA=${EXTRA:-}  # more Hydra overrides  # MoE with a given PROFILE: the routing skew its call measured (run.log); null: measured or uniform
BUDGET_S=${BUDGET_S:-0}
CARRIED=${CARRIED:-null}
STEPS=${STEPS:-}
WHEELS=${WHEELS:-.whl}
TAG=${TAG:-$(echo "$WORKLOADS" | tr ',' '-')}
# dense models serve a checkpoint written here; the MoE one (61 GB in bf16) random weights made on the GPU
case $MODEL in
  qwen3-0.6b|qwen3-8b) CK=/tmp/ck/$MODEL; WEIGHTS="backend.model=$CK";;
  qwen3-30b-a3b|tiny-qwen3-moe) CK=""; WEIGHTS="backend.load_format=dummy backend.record_expert_counts=true";;
  *) echo "MODEL must be qwen3-0.6b, qwen3-8b, qwen3-30b-a3b (or tiny-qwen3-moe on CPU), got $MODEL" >&2; exit 2;;
esac
for w in ${WORKLOADS//,/ }; do
  case ",$CLASSES," in *,"$w",*) ;; *) echo "WORKLOADS: unknown class $w; known: $CLASSES" >&2; exit 2;; esac
done
[[ $BUDGET_S =~ ^[0-9]+$ ]] || { echo "BUDGET_S must be a whole number of seconds (0: no limit), got $BUDGET_S" >&2; exit 2; }
case ",$WORKLOADS," in
  *,conversation,*|*,code_completion,*)
    [ -f .traces/azure_conv_2023.csv ] || { echo "$WORKLOADS needs .traces/azure_conv_2023.csv: carry .traces" >&2; exit 2; };;
esac
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
if [ "$WHEELS" != none ]; then  # none: Hydra is installed already (a CPU check)
  ls "$WHEELS"/hydra_core-*.whl > /dev/null 2>&1 || { echo "WHEELS=$WHEELS holds no hydra_core wheel: carry it" >&2; exit 2; }
  # installed once per machine: calls side by side (code_completion_gpu.sh) must not both write /tmp/site
  python3 -c "import hydra, omegaconf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl
fi
if [ -z "${HARDWARE:-}" ]; then
  case $(python3 -c "import torch; print(torch.cuda.get_device_name())") in
    *H200*) HARDWARE=h200;; *) HARDWARE=h100;;
  esac
fi
[ -z "$CK" ] || [ -f "$CK/config.json" ] || python3 -m engine.checkpoint --preset "$MODEL" --out "$CK" --dtype bfloat16 > /dev/null
RUN=${RUN_DIR:-/tmp/fidelity_run/$MODEL/$TAG}  # the harness run directory (profile, fit, log)
# workload.trace_path is read from the cwd
[ -f .traces/azure_conv_2023.csv ] && cp .traces/azure_conv_2023.csv .
mkdir -p "$OUT/$MODEL/$TAG"
STEPS_DIR=null
[ -n "$STEPS" ] && STEPS_DIR=$OUT/$MODEL/$TAG/steps
# max_model_len 16,384: above the prefill-heavy class's 10,240, so the grid's long chunks after
# 12k of cached context are profiled too (harness.calibration.profiling.ProfileGrid.long_prefill_*)
LIMIT=""
[ "$BUDGET_S" -gt 0 ] && LIMIT="timeout --signal=INT --kill-after=20 $BUDGET_S"
KEEP="profile.csv profile_model.csv validation.csv expert_counts.csv"
keep() { for f in $KEEP; do if [ -f "$RUN/$f" ]; then cp -u "$RUN/$f" "$OUT/$MODEL/"; fi; done; }
# the harness removes its run directory when BUDGET_S interrupts it: copy the profile as it appears
( while sleep 5; do keep || true; done ) &
WATCH=$!
set +e
$LIMIT python3 -m harness experiment=fidelity model=$MODEL hardware=$HARDWARE $WEIGHTS \
    scheduler.max_model_len=$MAX_MODEL_LEN "fidelity.workloads=[$WORKLOADS]" \
    "fidelity.loads=[$LOADS]" fidelity.num_requests=$NUM_REQUESTS fidelity.profile_path=$PROFILE \
    fidelity.carried_profile_path=$CARRIED fidelity.steps_dir=$STEPS_DIR fidelity.moe_routing_skew=$SKEW fidelity.moe_routing_locality=$LOCALITY \
    fidelity.results_dir=$OUT/$MODEL/$TAG hydra.run.dir=$RUN output.progress=false $EXTRA 2>&1 | tee "$OUT/$MODEL/$TAG/run.log"
status=${PIPESTATUS[0]}
kill "$WATCH" 2> /dev/null
set -e
keep
[ "$status" -eq 0 ] || { echo "harness exited $status (124 or 130: BUDGET_S ran out); partial results in $OUT/$MODEL" >&2; exit "$status"; }
echo "done: $OUT/$MODEL/$TAG"
