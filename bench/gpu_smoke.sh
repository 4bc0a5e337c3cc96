#!/usr/bin/env bash
# One-GPU smoke benchmark of the pretraining step (issue 10): the paper config at batch 256 with
# bf16 autocast, fused AdamW and SDPA, a few steps per variant, against a plain masked
# autoencoder of the same width timed in the same run; then with torch.compile; then the CUDA
# tests (no host sync per step, checkpointing memory). Needs a CUDA build of torch.
#
#   bash bench/gpu_smoke.sh                  # BATCH=256 STEPS=10 WARMUP=3 by default
#
# Prints the benchmark's JSON: samples/s, flops_utilisation (MFU against the bf16 matmul peak
# measured on this GPU in the same process), peak_memory_bytes (torch.cuda.max_memory_allocated).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to measure')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
BATCH=${BATCH:-256}; STEPS=${STEPS:-10}; WARMUP=${WARMUP:-3}
python -m bench.pretrain_step --device cuda --batch "$BATCH" --precisions bf16 \
    --variants core,core_ckpt,mae --steps "$STEPS" --warmup "$WARMUP" "$@"
python -m bench.pretrain_step --device cuda --batch "$BATCH" --precisions bf16 \
    --variants core,mae --steps "$STEPS" --warmup "$WARMUP" --set train.compile=true "$@"
python -m pytest -q tests/test_cuda.py tests/test_step_numerics.py
