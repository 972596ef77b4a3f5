#!/usr/bin/env bash
# H100 call of the balanced decode split: GPU tests of the decode kernel and of everything that
# replays it (backend, decode/prefill graphs, overlap, differential vs transformers), then the
# probe (experiments/kernels/decode_balance.py) on Qwen3-0.6B.
#   OUT=$OUT bash experiments/kernels/run_balance_h100.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
{ date -u; nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; } > "$OUT/env.txt" 2>&1
python3 -m engine.checkpoint --preset qwen3-0.6b --out /tmp/q06 --dtype bfloat16 > /dev/null
log "gpu tests"; timeout 300 python3 -m pytest -p no:cacheprovider -m gpu -q -rfE tests/kernels/test_decode_attention.py \
    tests/kernels/test_triton_backend.py tests/engine/test_cuda_graph.py tests/engine/test_prefill_graphs.py \
    tests/engine/test_overlap_gpu.py tests/engine/test_llm_differential.py > "$OUT/pytest_gpu.log" 2>&1
tail -3 "$OUT/pytest_gpu.log"
log "probe"; timeout 240 python3 experiments/kernels/decode_balance.py --out "$OUT/balance" --ckpt /tmp/q06 2>&1 | grep -v -i warn
log done
