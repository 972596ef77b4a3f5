#!/usr/bin/env bash
# The simulated half of the data-parallel validation (no GPU): the fleets validate_dp.sh served,
# simulated with PROFILE (a profiled model for the H200; default: run 6's H100 fit of Qwen3-0.6B
# carried to the H200 by sim.transfer), then compare_fleet.py tabulates both.
#   bash experiments/fleet/simulate_dp.sh OUT [SIMS]
# SIMS (default OUT) receives the sim_<case>/ folders and the comparison tables, so the same
# engine runs can be compared with several profiles; EXTRA: more overrides for every simulated run
# (e.g. EXTRA=backend.fleet_intake=true); SCRATCH: where the runs are written first (default /tmp/dp_sim).
set -euo pipefail
OUT=${1:?the folder validate_dp.sh wrote}
SIMS=${2:-$OUT}
# shellcheck source=experiments/fleet/dp_common.sh
source experiments/fleet/dp_common.sh
PROFILE=${PROFILE:-$OUT/qwen3-0.6b_h200_from_h100.csv}
[ -f "$PROFILE" ] || python experiments/fidelity/transfer_model.py \
    profiles/h100/qwen3-0.6b.csv --model qwen3-0.6b --source h100 --target h200 \
    --out "$PROFILE"
RATE=$(python -c "import re; print(re.search(r'rate ([0-9.]+)', open('$OUT/rate.txt').read()).group(1))")
[ -f azure_conv_2023.csv ] || cp ../shared/traces/azure_conv_2023.csv .
for router in round_robin least_requests; do
  for name in poisson trace; do
    python -m harness $COMMON fleet.replicas=2 router=$router $(workload_of "$name" "$RATE") \
        backend.cost_model=profiled backend.profile_path="$PROFILE" ${EXTRA:-} hydra.run.dir="${SCRATCH:-/tmp/dp_sim}/sim_${name}_${router}"
    mkdir -p "$SIMS/sim_${name}_${router}"
    cp "${SCRATCH:-/tmp/dp_sim}/sim_${name}_${router}/summary.csv" "$SIMS/sim_${name}_${router}/"
  done
done
python experiments/fleet/compare_fleet.py "$OUT" --sims "$SIMS"
