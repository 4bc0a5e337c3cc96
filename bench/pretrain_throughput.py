"""End-to-end pretraining throughput: the Ray Train + Ray Data path against the bare step.

    python bench/pretrain_throughput.py                     # paper model, batch 32, 2 CPUs
    python bench/pretrain_throughput.py --config configs/quickstart.yaml --epochs 3

Prints one JSON object with three comparisons, all measured in this run on this machine:
1. training samples/s: `jobs/pretrain.py`'s path (TorchTrainer, 1 worker holding every core,
   Ray Data shards, float16 ingest, per-epoch crops/shuffle, checkpoints at epoch ends; probe
   off) in steady state (epochs after the first), against a bare `PretrainStep` loop on the
   same config, batch and thread count fed from memory. Goal: ratio >= 0.9.
   The bare step runs in a fresh process without Ray and with OMP_NUM_THREADS set, like a
   Train worker (unset, the same step measured 18 % slower here).
2. ingest windows/s: the training dataset, materialised in the object store by Ray Data (what
   training uses below `data.cache_in_memory_gb`) and streamed (`ShardFiles`: the worker reads
   the shard files every epoch, as for a larger corpus), iterated as a worker iterates it
   (`epoch_batches`: float16, shuffle buffer), best epoch of 3, against plain pyarrow reading
   and decoding the same files, best of 3 passes; on `--ingest-records` synthetic records.
   Goals: ratio >= 0.5 and >= 10x the training rate.
3. seconds from launching `python jobs/pretrain.py` (a fresh Python, a fresh local Ray, the
   corpus already cached) to its first training step in metrics.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coreecg.config import load_config  # noqa: E402


def bare_step_rate(cfg, windows: np.ndarray, steps: int, warmup: int, threads: int) -> float:
    """Samples/s of PretrainStep alone on in-memory crops (no Ray, no data loading)."""
    from coreecg.methods import CoReECG
    from coreecg.train.ingest import memory_epoch_batches, to_model_input
    from coreecg.train.step import PretrainStep, Schedule

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = CoReECG(cfg)
    step = PretrainStep(model, cfg, Schedule(1000, 1, 0))
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


def ingest_rates(corpus: Path, batch: int, epochs: int, shuffle_buffer: int) -> dict:
    """Windows/s: Ray Data as a worker reads it, and plain pyarrow on the same files (best of 3
    warm passes each, so one-time imports and cold caches count for neither)."""
    from coreecg.data.corpus import decode_signals, load_manifest, split_files
    from coreecg.train.ingest import epoch_batches, local_source, training_dataset

    manifest = load_manifest(corpus)
    files = split_files(corpus, "train", manifest)
    shape = tuple(manifest["signal"]["shape"])
    arrow_rates = []
    for _ in range(3):
        t = time.perf_counter()
        n = 0
        for f in files:
            n += len(decode_signals(pq.read_table(f, columns=["signal"]).column("signal"), shape, as_stored=True))
        arrow_rates.append(n / (time.perf_counter() - t))
    arrow = max(arrow_rates)
    out = {"pyarrow_windows_per_s": arrow, "windows": n}
    # materialised: what training uses below data.cache_in_memory_gb (this corpus);
    # streaming: the worker reads the shard files every epoch, as for a corpus larger than that
    for mode, cache_gb in (("materialized", 1e9), ("streaming", 0.0)):
        ds = training_dataset(corpus, seed=0, cache_in_memory_gb=cache_gb)
        rates = []
        for e in range(epochs):
            it = local_source(ds)
            t = time.perf_counter()
            m = sum(len(s) for s, _ in epoch_batches(it, batch, e, 0, 0, shuffle_buffer, torch.device("cpu")))
            rates.append(m / (time.perf_counter() - t))
        out[f"ingest_{mode}_windows_per_s_per_epoch"] = rates
        out[f"ingest_{mode}_windows_per_s"] = max(rates)
    return out


def ray_path_rate(cfg) -> tuple[float, list[float]]:
    from coreecg.train.distributed import pretrain

    pretrain(cfg)
    lines = [json.loads(x) for x in (cfg.train.run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [x["samples_per_s"] for x in lines if x.get("kind") == "epoch"]
    return float(np.median(rates[1:])), rates


def time_to_first_step(overrides: list[str], storage: Path) -> float:
    run = storage / "first-step"
    shutil.rmtree(run, ignore_errors=True)
    args = [sys.executable, "jobs/pretrain.py", *sum((["--set", s] for s in overrides), []),
            "--set", f"train.storage_path={storage}", "--set", "train.name=first-step", "--set", "train.log_every=1"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        proc.kill()
        proc.wait()


def _bare_in_fresh_process(args, corpus: Path, threads: int) -> float:
    """The bare step in a new Python with no Ray in it, as a Train worker process is."""
    cmd = [sys.executable, __file__, "--bare-only", str(corpus), "--batch", str(args.batch),
           "--steps", str(args.steps), *(["--config", args.config] if args.config else []),
           *sum((["--set", s] for s in args.set), [])]
    # Ray sets OMP_NUM_THREADS to a worker's CPUs; without it the same step measured 18 % slower.
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["bare_step_samples_per_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="YAML over the paper defaults (default: the paper model)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--records", type=int, default=256, help="synthetic records in the benchmark corpus")
    p.add_argument("--epochs", type=int, default=2, help="Ray-path epochs (the first is start-up)")
    p.add_argument("--steps", type=int, default=5, help="bare-step timed steps")
    p.add_argument("--ingest-records", type=int, default=2048, help="synthetic records for the ingest comparison")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--bare-only", metavar="CORPUS", help=argparse.SUPPRESS)   # child process
    args = p.parse_args()
    threads = os.cpu_count() or 1
    if args.bare_only:
        from coreecg.data.reading import read_split
        cfg = load_config(args.config, [f"optim.batch_size={args.batch}", *args.set])
        windows = read_split(args.bare_only, "train", columns=["signal"])["signal"][: 4 * args.batch]
        print(json.dumps({"bare_step_samples_per_s": bare_step_rate(cfg, windows, args.steps, 1, threads)}))
        return

    import ray

    from coreecg.cluster import init_ray
    from coreecg.data.locate import synthetic_corpus

    storage = Path(tempfile.mkdtemp(prefix="coreecg-bench-"))
    common = [f"optim.batch_size={args.batch}", f"data.synthetic_records={args.records}", "train.eval_every_epochs=0",
              "train.checkpoint_every_steps=0", f"train.storage_path={storage}", *args.set]
    cfg = load_config(args.config, [*common, f"optim.epochs={args.epochs}", "train.num_workers=1",
                                    f"train.cpus_per_worker={threads}", "train.name=throughput"])
    init_ray(threads)
    corpus = synthetic_corpus(cfg)
    out: dict = {"config": args.config or "paper defaults", "batch": args.batch, "threads": threads,
                 "corpus_windows_train": None}

    ingest_cfg = load_config(args.config, [*common, f"data.synthetic_records={args.ingest_records}"])
    ingest = ingest_rates(synthetic_corpus(ingest_cfg), args.batch, 3, cfg.data.shuffle_buffer)
    out["corpus_windows_train"] = ingest["windows"]
    ray_rate, per_epoch = ray_path_rate(cfg)
    print(json.dumps({"ray_train_samples_per_s_per_epoch": per_epoch}), file=sys.stderr, flush=True)
    bare = _bare_in_fresh_process(args, corpus, threads)
    out["training"] = {"ray_train_samples_per_s": ray_rate, "ray_train_samples_per_s_per_epoch": per_epoch,
                       "bare_step_samples_per_s": bare, "ratio": ray_rate / bare, "goal": 0.9}
    used = ingest["ingest_materialized_windows_per_s"]      # this corpus is below cache_in_memory_gb
    out["ingest"] = {**ingest, "training_uses": "materialized",
                     "ratio_to_pyarrow": used / ingest["pyarrow_windows_per_s"],
                     "streaming_ratio_to_pyarrow": ingest["ingest_streaming_windows_per_s"] / ingest["pyarrow_windows_per_s"],
                     "times_training_rate": used / ray_rate,
                     "goals": {"ratio_to_pyarrow": 0.5, "times_training_rate": 10}}
    ray.shutdown()
    first_overrides = [o for o in common if not o.startswith("train.storage_path")] + [
        "optim.epochs=1", f"data.cache_dir={cfg.data.cache_dir}"]
    if args.config:
        first_overrides = [*first_overrides]
    out["seconds_to_first_step"] = time_to_first_step(first_overrides, storage)
    shutil.rmtree(storage, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
