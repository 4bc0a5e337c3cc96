"""Benchmark one CoRe-ECG pretraining step at the paper's model size.

    python bench/pretrain_step.py                      # CPU: batch 32, fp32/bf16 x bernoulli/exact
    python bench/pretrain_step.py --device cuda --batch 256

Prints one JSON object: per variant samples/s, seconds/step, peak memory, analytic FLOPs per
sample, achieved FLOP/s and its ratio to a matmul peak measured on the same device in the
same run. Each variant runs in a fresh subprocess so peak-memory figures do not mix.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.flops import pretrain_flops_per_sample  # noqa: E402
from coreecg.config import load_config  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int = 2048, reps: int = 20) -> float:
    """Best-of FLOP/s of an n x n matmul: the ceiling the model's FLOP/s is compared with."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def run_variant(args) -> dict:
    from coreecg.model import CoReECG
    from coreecg.train.step import PretrainStep, Schedule

    device = torch.device(args.device)
    cfg = load_config(args.config, [f"train.precision={args.precision}", f"masking.mode={args.mode}", *args.set])
    torch.manual_seed(0)
    model = CoReECG(cfg).to(device)
    step = PretrainStep(model, cfg, Schedule(steps_per_epoch=1000, epochs=1, warmup_epochs=0))
    x = torch.randn(args.batch, cfg.model.n_leads, cfg.model.input_samples, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        step(x, generator=gen)
    sync(device)
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        out = step(x, generator=gen)
        float(out["loss"])      # the host sync a real loop pays when it logs
        sync(device)
        times.append(time.perf_counter() - t)
    sec = sorted(times)[len(times) // 2]
    flops = pretrain_flops_per_sample(cfg)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peak = matmul_peak(device, dtype)
    achieved = flops["train_step"] * args.batch / sec
    result = {
        "precision": args.precision, "stdm_mode": args.mode, "batch": args.batch,
        "seconds_per_step_median": sec, "seconds_per_step_all": times,
        "samples_per_s": args.batch / sec,
        "train_flops_per_sample": flops["train_step"], "forward_flops_per_sample": flops["forward"],
        "achieved_flops_per_s": achieved, "matmul_peak_flops_per_s": peak, "flops_utilisation": achieved / peak,
        "loss": float(out["loss"]),
    }
    if device.type == "cuda":
        result["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    else:   # ru_maxrss is KiB on Linux; the growth during the steps is the step's working set
        result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        result["peak_rss_growth_bytes"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=None, help="default: 32 on CPU, 256 on CUDA")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--modes", default="bernoulli,exact")
    p.add_argument("--config", default=None)
    p.add_argument("--set", action="append", default=[], metavar="A.B=C")
    p.add_argument("--precision", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.batch = args.batch or (256 if args.device.startswith("cuda") else 32)
    if args.precision:                       # child process: one variant
        print(json.dumps(run_variant(args)))
        return
    results = []
    for precision in args.precisions.split(","):
        for mode in args.modes.split(","):
            cmd = [sys.executable, __file__, "--device", args.device, "--batch", str(args.batch),
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--precision", precision,
                   "--mode", mode] + (["--config", args.config] if args.config else [])
            for s in args.set:
                cmd += ["--set", s]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                results.append({"precision": precision, "stdm_mode": mode, "error": done.stderr.strip()[-2000:]})
            else:
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(json.dumps({
        "benchmark": "pretrain_step", "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
        "overrides": args.set, "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
