"""End-to-end pretraining throughput: the Ray Train + Ray Data path against the bare step.

    python -m bench.pretrain_throughput                     # paper model, batch 32, all CPUs
    python -m bench.pretrain_throughput --config configs/quickstart.yaml --epochs 3
    python -m bench.pretrain_throughput --quick             # tiny model, 64 records: a smoke run

Prints one JSON object, every figure measured in this run on this machine:
1. training samples/s: `coreecg.train.fit.fit` (what `jobs/pretrain.py` runs:
   TorchTrainer, 1 worker holding every core, the materialised training dataset, float16
   ingest, per-epoch crops/shuffle, checkpoints at epoch ends; probe off) in steady state
   (epochs after the first), against a bare `PretrainStep` loop on the same config, batch and
   thread count fed from memory. Goal: ratio >= 0.9. The bare step runs in a fresh process
   without Ray and with OMP_NUM_THREADS set, like a Train worker (unset, the same step
   measured 18 % slower here).
2. seconds from launching `python jobs/pretrain.py` (a fresh Python, a fresh local Ray, the
   corpus already cached) to its first training step in metrics.jsonl.
Ingest alone (the training dataset against plain pyarrow) is `python -m bench.ingest`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import REPO, TINY, child, config_args, emit, job, job_env, machine, parser, progress, sets
from coreecg.config import load_config


def bare_step_rate(cfg, windows: np.ndarray, steps: int, warmup: int, threads: int) -> float:
    """Samples/s of PretrainStep alone on in-memory crops (no Ray, no data loading)."""
    from coreecg.methods import build_method
    from coreecg.train.ingest import memory_epoch_batches, to_model_input
    from coreecg.train.step import PretrainStep, Schedule

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    step = PretrainStep(build_method(cfg), cfg, Schedule(1000, 1, 0))
    gen = torch.Generator().manual_seed(0)
    data = torch.from_numpy(windows)
    per_epoch = len(data) // cfg.optim.batch_size
    times = []
    for i in range(warmup + steps):
        if i % per_epoch == 0:
            batches = memory_epoch_batches(data, cfg.optim.batch_size, i // per_epoch, 0, torch.device("cpu"))
        signal, uid = next(batches)
        x = to_model_input(signal, uid, 0, 0, cfg.data.crop_samples)
        t = time.perf_counter()
        step(x, generator=gen)
        times.append(time.perf_counter() - t)
    return cfg.optim.batch_size / float(np.median(times[warmup:]))


def ray_path_rate(cfg) -> tuple[float, list[float]]:
    from coreecg.train.fit import fit, plan_run

    fit(plan_run(cfg, "pretrain"))
    lines = [json.loads(x) for x in (cfg.train.run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [x["samples_per_s"] for x in lines if x.get("kind") == "epoch"]
    return float(np.median(rates[1:])), rates


def time_to_first_step(overrides: list[str], storage: Path) -> float:
    run = storage / "first-step"
    shutil.rmtree(run, ignore_errors=True)
    cmd = job("pretrain", *sets([*overrides, f"train.storage_path={storage}", "train.name=first-step",
                                 "train.log_every=1"]))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(drop=("RAY_ADDRESS",)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run / "metrics.jsonl"
    try:
        while time.perf_counter() - t0 < 600:
            if metrics.is_file() and '"kind": "step"' in metrics.read_text():
                return time.perf_counter() - t0
            if proc.poll() is not None:
                raise RuntimeError(f"jobs/pretrain.py exited with {proc.returncode} before its first step")
            time.sleep(0.1)
        raise TimeoutError("no training step within 600 s")
    finally:
        proc.kill()       # the job this benchmark started; its first step is all it was for
        proc.wait()


def main() -> None:
    p = parser(__doc__, "the tests' tiny model, 64 records, batch 8, 2 epochs, 2 bare steps")
    config_args(p)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--records", type=int, default=256, help="synthetic records in the benchmark corpus")
    p.add_argument("--epochs", type=int, default=2, help="Ray-path epochs (the first is start-up)")
    p.add_argument("--steps", type=int, default=5, help="bare-step timed steps")
    p.add_argument("--bare-only", metavar="CORPUS", help=argparse.SUPPRESS)   # child process
    args = p.parse_args()
    threads = os.cpu_count() or 1
    if args.quick and not args.bare_only:
        args.set = [*TINY, *args.set]
        args.batch, args.records, args.steps = 8, 64, 2
    if args.bare_only:
        from coreecg.data.reading import read_split

        cfg = load_config(args.config, [f"optim.batch_size={args.batch}", *args.set])
        windows = read_split(args.bare_only, "train", columns=["signal"])["signal"][: 4 * args.batch]
        emit({"bare_step_samples_per_s": bare_step_rate(cfg, windows, args.steps, 1, threads)}, one_line=True)
        return

    import ray

    from coreecg.cluster import init_ray
    from coreecg.data.locate import synthetic_corpus

    storage = Path(tempfile.mkdtemp(prefix="coreecg-bench-"))
    common = [f"optim.batch_size={args.batch}", f"data.synthetic_records={args.records}", "train.eval_every_epochs=0",
              "train.checkpoint_every_steps=0", *args.set]
    cfg = load_config(args.config, [*common, f"train.storage_path={storage}", f"optim.epochs={args.epochs}",
                                    "train.num_workers=1", f"train.cpus_per_worker={threads}", "train.name=throughput"])
    init_ray(threads)
    corpus = synthetic_corpus(cfg)
    ray_rate, per_epoch = ray_path_rate(cfg)
    progress({"ray_train_samples_per_s_per_epoch": per_epoch})
    ray.shutdown()
    # Ray sets OMP_NUM_THREADS to a worker's CPUs; without it the same step measured 18 % slower.
    bare = child("pretrain_throughput", ["--bare-only", str(corpus), "--batch", str(args.batch), "--steps",
                                         str(args.steps), *(["--config", args.config] if args.config else []),
                                         *sets(args.set)], env={"OMP_NUM_THREADS": str(threads)})
    bare_rate = bare["bare_step_samples_per_s"]
    first_step = time_to_first_step([*common, "optim.epochs=1", f"data.cache_dir={cfg.data.cache_dir}"], storage)
    shutil.rmtree(storage, ignore_errors=True)
    emit({"benchmark": "pretrain_throughput", **machine(), "config": args.config or "paper defaults",
          "overrides": args.set, "batch": args.batch, "records": args.records,
          "training": {"ray_train_samples_per_s": ray_rate, "ray_train_samples_per_s_per_epoch": per_epoch,
                       "bare_step_samples_per_s": bare_rate, "ratio": ray_rate / bare_rate, "goal": 0.9},
          "seconds_to_first_step": first_step})


if __name__ == "__main__":
    main()
