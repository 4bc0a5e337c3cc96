#!/usr/bin/env bash
# On a lent GPU (docs/gpu_lease.md): bench/gpu_smoke.sh (CUDA tests, step figures), then the Ray path:
# synthetic corpus at batch 256, then the shared real records. Writes under $OUT (the device tool's).
set -uo pipefail
START=$SECONDS
exec > >(tee "$OUT/log.txt") 2>&1
source bench/lease/setup.sh
OUT_DIR=$OUT/g timeout ${SMOKE_LIMIT:-330} bash bench/gpu_smoke.sh
echo "== gpu_smoke done at $((SECONDS - START)) s"
timeout ${RAY_LIMIT:-210} python -m bench.pretrain_throughput --device cuda --batch 256 --records ${RECORDS:-8192} --steps-total ${STEPS_TOTAL:-200} \
    --steps 20 >> "$OUT/ray.txt"
echo "== ray synthetic rc $? done at $((SECONDS - START)) s"
if (( SECONDS - START < ${REAL_BEFORE:-430} )); then
    for s in "ptbxl ptbxl" "cpsc2018 cpsc2018-cinc2020"; do
        set -- $s
        timeout 60 python jobs/preprocess.py --source "$1" --input "../shared/ecg-data/$2" --output "/tmp/corpora/$1" \
            > /dev/null || echo "preprocess $1 failed"
    done
    echo "== real corpora built at $((SECONDS - START)) s"
    timeout $(( ${LIMIT:-550} - (SECONDS - START) )) python -m bench.pretrain_throughput --device cuda --batch 32 \
        --corpus /tmp/corpora/ptbxl /tmp/corpora/cpsc2018 --steps-total 48 --steps 20 >> "$OUT/ray.txt"
    echo "== ray real rc $? done at $((SECONDS - START)) s"
fi
