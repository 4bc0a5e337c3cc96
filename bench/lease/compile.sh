#!/usr/bin/env bash
# Issue 41's step figures on a lent GPU (docs/gpu_lease.md), sized to a short lease, in order of
# what matters if time runs out:
#   tests          the CUDA tests of the compiled step (TESTS_K picks a subset)
#   step_*.json    bench.pretrain_step, paper config, batch 256, bf16, STEPS timed steps and no warm-up
#                  (the whole window): eager, then compiled (MODES; GRAPHS=1 adds CUDA graphs)
# Writes under $OUT (the device tool's). Each part has its own time limit (seconds, env knobs).
set -uo pipefail
START=$SECONDS
exec > >(tee "$OUT/log.txt") 2>&1
source bench/lease/setup.sh
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-bench
stamp() { echo "== $1 at $((SECONDS - START)) s"; }
if [ -n "${TESTS_K-}" ]; then
    timeout ${TESTS_LIMIT:-90} python -m pytest -q -p no:cacheprovider -rfE --tb=short tests/test_cuda_compile.py \
        -k "$TESTS_K" > "$OUT/tests.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -n 20
    stamp tests
fi
MODES=${MODES:-bernoulli,exact}
common=(--device cuda --batch 256 --precisions bf16 --steps ${STEPS:-20} --warmup 0 --in-process --variants core --modes "$MODES")
timeout ${STEP_LIMIT:-60} python -m bench.pretrain_step "${common[@]}" --set train.compile=false > "$OUT/step_eager.json"
stamp step_eager
for mode in ${MODES//,/ }; do      # one file per mode: a time limit keeps what finished
    timeout ${STEP_LIMIT_COMPILED:-90} python -m bench.pretrain_step "${common[@]}" --modes "$mode" \
        --set train.compile=true > "$OUT/step_compiled_$mode.json"
    stamp "step_compiled $mode"
done
if [ -n "${GRAPHS-}" ]; then
    timeout ${STEP_LIMIT_GRAPHS:-100} python -m bench.pretrain_step "${common[@]}" --set train.compile=true \
        --set train.compile_mode=reduce-overhead > "$OUT/step_graphs.json"
    stamp step_graphs
fi
for f in "$OUT"/step_*.json; do
    python -c "import json, sys; d = json.load(open(sys.argv[1])); [print(sys.argv[1].split('/')[-1], r) for r in d['summary']['runs']]" "$f" || true
done
