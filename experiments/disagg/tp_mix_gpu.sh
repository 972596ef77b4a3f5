#!/usr/bin/env bash
# The GPU tests of pools of two TP sizes and of the KV link, on a machine of 3 or more GPUs (kind
# nvidia-h200-x4): the disaggregated fleet with a TP 1 and a TP 2 replica over NCCL against the
# aggregated engine's greedy float32 tokens, the KV heads regrouped rank to rank, and the 2-GPU
# disaggregation and TP suites beside them. Carry .whl (the Hydra wheels). Writes $OUT/gpus.txt and
# $OUT/pytest_gpu.log (-rs: every skip with its reason).
#   OUT=$OUT bash experiments/disagg/tp_mix_gpu.sh
set -euo pipefail
OUT=${OUT:?set OUT}
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
python3 -c "import hydra" 2> /dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
nvidia-smi -L > "$OUT/gpus.txt"
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())" >> "$OUT/gpus.txt"
timeout "${LIMIT_S:-480}" python3 -m pytest -q -m gpu -rs -p no:cacheprovider \
    tests/engine/test_disagg_tp_mix_gpu.py tests/engine/test_kv_reshard.py tests/engine/test_kv_link_gpu.py \
    tests/engine/test_disagg_gpu.py tests/engine/test_tp_gpu.py 2>&1 | tee "$OUT/pytest_gpu.log"
