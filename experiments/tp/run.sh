#!/usr/bin/env bash
# TP=2 against TP=1 on 2 x H200 (device kind nvidia-h200-x2), Qwen3-8B shape (random bf16 weights,
# written once to checkpoints/qwen3_8b/ by the harness), nano-vllm's bench (256 requests).
#   bash experiments/tp/run.sh tp1      # engine TP=1 + inline profile + sim (profiled, roofline) -> $OUT/tp1
#   bash experiments/tp/run.sh tp2      # engine TP=2 + sim (roofline at TP=2)                   -> $OUT/tp2
# Each stage is one device call (under 10 minutes); then, anywhere (the simulator only):
#   PYTHONPATH=. python experiments/tp/transfer_tp.py --tp1 DIR/tp1 --tp2 DIR/tp2 --out DIR model=qwen3-8b hardware=h200 workload=bench
set -euo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# NVLink multicast off (KINDS.md; as experiments/engine/tp_h200x2/).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT}
COMMON=(experiment=compare model=qwen3-8b hardware=h200 workload=bench output.progress=false)
{ nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; } \
    > "$OUT/env.txt" 2>&1
case "${1:?stage: tp1 or tp2}" in
  tp1) python3 -m harness "${COMMON[@]}" execution.tensor_parallel_size=1 hydra.run.dir="$OUT/tp1" ;;
  tp2) python3 -m harness "${COMMON[@]}" execution.tensor_parallel_size=2 'compare.cost_models=[roofline]' \
           hydra.run.dir="$OUT/tp2" ;;
  *) echo "unknown stage $1 (tp1 or tp2)" >&2; exit 2 ;;
esac
