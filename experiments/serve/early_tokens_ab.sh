#!/usr/bin/env bash
# Serving run 9 (one GPU): do the engine server's steps run slower than the harness's loop because
# of the core process's token thread (harness/serve/handoff.py)? The four cases (Azure and Mooncake
# at 50% and 80%, run 7's requests and rates) by the harness's loop and the engine's server with
# the thread on (the default), the two 50% cases again with it off (serve.early_tokens=false), then
# the simulator's server priced at each engine server's measured host. Two calls on one warm
# machine (each under the device's 600 s), carrying .whl (Hydra, .whl/serve, .whl/loadgen) and .traces:
#
#   OUT=$OUT bash experiments/serve/early_tokens_ab.sh engine   # on a GPU: harness + both engine servers
#   OUT=$OUT bash experiments/serve/early_tokens_ab.sh sim      # on the same machine afterwards
#
# Outputs stay in .serve_prev/run9/ (ignored) between the calls; each call packs them into $OUT.
set -uo pipefail
stage=${1:?engine or sim}
keep=.serve_prev/run9
cases=azure_50,azure_80,mooncake_50,mooncake_80
capacity=azure=59.1443,mooncake=18.71686
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .whl/serve/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/loadgen .whl/loadgen/*.whl
export PYTHONPATH=/tmp/site:$PWD
export LOADGEN_AIPERF="env PYTHONPATH=/tmp/loadgen:/tmp/site python3 -m aiperf"
bench() {  # bench SECONDS ARGS...: the benchmark, stopped after SECONDS
    local limit=$1; shift
    timeout "$limit" python3 -m experiments.serve.bench_serve --trace-dir .traces --loadgen aiperf --capacity $capacity \
        "$@" 2>&1 | grep --line-buffered -v -e clipped -e Warning -e "duration = "
}
mkdir -p $keep "$OUT"
if [ "$stage" = engine ]; then
    (nproc; lscpu; nvidia-smi -L) > $keep/host.txt 2>&1
    (while sleep 5; do echo "== $(date +%s)"; ps -eo pid,ppid,psr,pcpu,nlwp,args --sort=-pcpu | head -14 | cut -c1-160
     done) > $keep/ps.log 2>&1 &
    sampler=$!
    bench 360 --out $keep/on --cases $cases --stages harness,engine | tee $keep/on.log
    bench 170 --out $keep/off --cases azure_50,mooncake_50 --stages engine \
        --engine-server serve.early_tokens=false | tee $keep/off.log
    kill $sampler
else
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in
        *H200*) grid=experiments/fidelity/code_completion_h200_r2/qwen3-0.6b/profile.csv.gz ;;
        *) grid=experiments/calibration/h100_run6/qwen3_0_6b/profile.csv ;;
    esac
    sim=(backend=sim model=qwen3-0.6b backend.cost_model=profiled backend.repeated_reads=overlap
         backend.decode_programs_baseline=grid_spread hardware.decode_programs_per_sm=5
         "backend.launch_line_grid=$PWD/$grid")
    bench 330 --out $keep/on --cases $cases --stages sim --merge $keep/on --sim "${sim[@]}" | tee $keep/on_sim.log
    bench 200 --out $keep/off --cases azure_50,mooncake_50 --stages sim --merge $keep/off \
        --sim "${sim[@]}" | tee $keep/off_sim.log
fi
# one file: a call hands back only a few files
tar -czf "$OUT/run9_$stage.tar.gz" -C $keep .
