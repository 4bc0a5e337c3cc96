#!/usr/bin/env bash
# One-GPU benchmark of the pretraining step (issues 10, 31) and the CUDA tests. Needs a CUDA build
# of torch. Every part runs even when an earlier one fails; the failed parts are named at the end.
#
#   bash bench/gpu_smoke.sh                  # BATCH=256 STEPS=10 WARMUP=3, JSON under OUT_DIR
#   OUT_DIR=/tmp/gpu bash bench/gpu_smoke.sh --set optim.batch_size=256   # extra args: every bench
#
# Each part writes OUT_DIR/<part>.json (bench.pretrain_step's JSON: per run samples/s,
# flops_utilisation = MFU against the bf16 matmul peak measured in the same process,
# peak_memory_bytes = torch.cuda.max_memory_allocated, and with --profile the device time by kind
# of kernel and the device's busy share), in the paper config at batch 256, bf16:
#   step_eager      CoRe-ECG (bernoulli and exact STDM), the plain MAE, MoCo v3, CMSC; profiled
#   step_memory     CoRe-ECG with and without activation checkpointing
#   step_attention  the same with the memory-efficient attention kernel forced (eager's `auto`
#                   runs flash wherever no mask is passed: exact STDM, MoCo v3, CMSC)
#   step_padded     CoRe-ECG keeping the key-padding mask everywhere (a corpus with short records)
#   step_compiled   CoRe-ECG with train.compile=true; profiled
#   tests           (first) tests/test_cuda.py (every CUDA path), test_unpadded, test_step_numerics,
#                   test_distributed_loss (the gather fallback on an older torch)
set -uo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to measure')" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
OUT_DIR=${OUT_DIR:-bench-out/gpu}
mkdir -p "$OUT_DIR"
BATCH=${BATCH:-256}; STEPS=${STEPS:-10}; WARMUP=${WARMUP:-3}
common=(--device cuda --batch "$BATCH" --precisions bf16 --steps "$STEPS" --warmup "$WARMUP" --in-process)
eager=(--set train.compile=false)      # train.compile=auto compiles on CUDA: the eager parts say so
failed=()

part() {     # part NAME COMMAND...: stdout to OUT_DIR/NAME.json (or .log), progress to stderr
    local name=$1 ext=json t0=$SECONDS
    shift
    [[ $name == tests ]] && ext=log
    echo "== $name: $*" >&2
    if ! "$@" > "$OUT_DIR/$name.$ext"; then failed+=("$name"); fi
    echo "== $name: $((SECONDS - t0)) s" >&2
}

# Correctness first, each failure's reason in the log's summary (-rfE), no test longer than 5 min.
part tests python -m pytest -q -p no:cacheprovider -rfE --tb=short --timeout 300 tests/test_cuda.py \
    tests/test_unpadded.py tests/test_step_numerics.py tests/test_distributed_loss.py
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT_DIR/tests.log" | tail -n 20 >&2
part step_eager python -m bench.pretrain_step "${common[@]}" --variants core,mae,moco_v3,cmsc \
    --modes bernoulli,exact --profile 3 "${eager[@]}" "$@"
part step_memory python -m bench.pretrain_step "${common[@]}" --variants core,core_ckpt --modes bernoulli "${eager[@]}" "$@"
part step_attention python -m bench.pretrain_step "${common[@]}" --variants core,moco_v3,cmsc --modes exact \
    --sdpa efficient "${eager[@]}" "$@"
part step_padded python -m bench.pretrain_step "${common[@]}" --variants core --modes bernoulli,exact --padded "${eager[@]}" "$@"
part step_compiled python -m bench.pretrain_step "${common[@]}" --variants core --modes bernoulli,exact \
    --profile 3 --set train.compile=true "$@"
for f in "$OUT_DIR"/step_*.json; do
    python -c "import json, sys; d = json.load(open(sys.argv[1])); [print(r) for r in d['summary']['runs']]
[print('error:', r['variant'], r['stdm_mode'], r['sdpa'], r['error'][-300:]) for r in d['results'] if 'error' in r]" "$f"
done
if ((${#failed[@]})); then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
