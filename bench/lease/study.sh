#!/usr/bin/env bash
# On a lent GPU (docs/gpu_lease.md): studies/tiny.yaml on the GPU (bench/study.py: wall, training-step share).
set -uo pipefail
START=$SECONDS
exec > >(tee "$OUT/log2.txt") 2>&1
source bench/lease/setup.sh
timeout $(( ${LIMIT:-300} - (SECONDS - START) )) python -m bench.study --set train.use_gpu=true \
    --output /tmp/study-gpu > "$OUT/study.json"
echo "== study rc $? at $((SECONDS - START)) s"
ls /tmp/study-gpu/c1 2>/dev/null | head
