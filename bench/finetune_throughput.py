"""Fine-tuning throughput: the Ray Train path (`finetune`) against the bare FinetuneStep, and
evaluation windows/s under the crop rule.

    python -m bench.finetune_throughput                                  # quickstart model, ~1.5 min on 2 idle CPUs
    python -m bench.finetune_throughput --config configs/paper.yaml --no-ray --steps 3 --warmup 1 \\
        --eval-windows 32                                                # paper model: bare + eval only
    python -m bench.finetune_throughput --mode finetune --corpus corpora/ptbxl
    python -m bench.finetune_throughput --quick                          # tiny model, 128 records: a smoke run

Prints one JSON object (last on stdout), every figure measured in this run on this machine:
1. `bare_samples_per_s`: `FinetuneStep` alone (forward, loss, backward, clip, AdamW) on the same
   `Classifier` (an `Encoder` from the config's model section + the linear head; frozen encoder
   in linear mode), the same global batch, fp32, on in-memory random crops (B, C, crop) with
   random one-hot targets; median step time after `--warmup` steps. It runs in a fresh Python
   without Ray, with OMP_NUM_THREADS and torch.set_num_threads equal to the CPUs the Ray run's
   workers hold together (num_workers * cpus_per_worker = 2 by default): the same compute, one
   process instead of two. `bare_per_worker`: the same step at one worker's share (batch
   B / num_workers, cpus_per_worker threads), times num_workers: data parallelism without any
   communication or data loading, to separate "2 x 1 thread vs 1 x 2 threads" from Ray/DDP costs.
2. `ray_samples_per_s`: `coreecg.train.fit.fit(plan_run(config, "finetune"))` (TorchTrainer, DDP over
   `--workers` workers of `cpus_per_worker` CPUs each, Ray Data shards of the labelled corpus,
   rank-0 validation, a checkpoint report per epoch, test metrics at the end), steady state =
   the median `samples_per_s` of metrics.jsonl's epoch lines after the first. That figure is
   the loop's own (epoch seconds stop before the rank-0 validation and the report), so
   `ray_wall` adds the wall-clock view, from the times at which metrics.jsonl lines appeared:
   samples of epochs 2..E over the time from epoch 1's line to epoch E's (validation, reports
   and checkpoints included), and its split into steps / validation / the rest.
   `ratio` = ray / bare. `seconds_to_first_step`: from calling `fit()` in this process
   (imports done, this bench's own local Ray already started) to rank 0's first step line
   (train.log_every=1 for this); the local Ray is `coreecg.cluster.init_ray`'s, started by this bench.
   Corpus: the embedded synthetic corpus of `--records` records (cached under data.cache_dir),
   or `--corpus DIR`. Mode scratch by default; finetune/linear get a randomly initialised
   encoder.pt exported from a CoReECG of the same config.
3. `eval_windows_per_s`: `coreecg.eval.downstream.predict` on `--eval-windows` random float16
   (N, C, T_stored) windows, with 3 crops and with 1 (the centre crop), finetune.eval_batch_size
   per batch, at the bare loop's threads and at one worker's (rank 0 validates alone).

Outputs (run folder, encoder.pt) go to a temporary folder that is removed at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import REPO, TINY, child, emit, machine, parser, sets
from coreecg.config import load_config


# ---------------------------------------------------------------------------- bare (child process)


def bare_rates(cfg, spec: dict) -> dict:
    """Samples/s of FinetuneStep alone, then predict()'s windows/s, at spec["threads"] threads."""
    from coreecg.eval.downstream import predict
    from coreecg.model.classifier import Classifier
    from coreecg.model.published import build_encoder
    from coreecg.train.ingest import to_model_input
    from coreecg.train.step import FinetuneStep, Schedule

    threads, batch, f = spec["threads"], spec["batch"], cfg.finetune
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    leads, k, stored = list(f.leads), spec["classes"], spec["stored_samples"]
    model = Classifier.for_mode(build_encoder(cfg), k, leads, spec["multilabel"], f.mode)
    step = FinetuneStep(model, cfg, Schedule(max(1, spec["steps_per_epoch"]), f.epochs, f.warmup_epochs))
    gen = torch.Generator().manual_seed(0)
    pool = 4                                             # batches of stored windows held in memory
    signal = torch.randn(pool * batch, len(leads), stored, generator=gen).to(torch.float16)
    if spec["multilabel"]:
        target = (torch.rand(pool * batch, k, generator=gen) < 0.2).float()
    else:
        target = torch.nn.functional.one_hot(torch.randint(0, k, (pool * batch,), generator=gen), k).float()
    times = []
    for i in range(spec["warmup"] + spec["steps"]):
        j = (i % pool) * batch
        uid = torch.arange(j, j + batch)
        x = to_model_input(signal[j:j + batch], uid, cfg.train.seed, i // pool, cfg.data.crop_samples)
        t = time.perf_counter()
        step(x, target[j:j + batch])
        times.append(time.perf_counter() - t)
    timed = times[spec["warmup"]:]
    out = {"threads": threads, "batch": batch, "steps": len(timed),
           "samples_per_s": batch / float(np.median(timed)),
           "samples_per_s_mean": batch * len(timed) / float(np.sum(timed)),
           "step_seconds": [round(x, 4) for x in times],
           "parameters": sum(p.numel() for p in model.parameters()),
           "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    n = spec["eval_windows"]
    if n:
        windows = np.random.default_rng(0).standard_normal((n, len(leads), stored), dtype=np.float32)
        windows = windows.astype(np.float16)
        rows = list(range(len(leads)))
        evals = {}
        for crops in spec["eval_crops"]:
            predict(model, windows[:min(n, 8)], rows, cfg.data.crop_samples, crops, torch.device("cpu"),
                    f.eval_batch_size, cfg.train.precision)                        # warm-up
            t = time.perf_counter()
            predict(model, windows, rows, cfg.data.crop_samples, crops, torch.device("cpu"),
                    f.eval_batch_size, cfg.train.precision)
            evals[f"crops{crops}"] = n / (time.perf_counter() - t)
        out["eval_windows_per_s"] = evals
    return out


def run_bare_child(args, spec: dict) -> dict:
    """bare_rates in a new Python with no Ray in it and OMP_NUM_THREADS set, as a Train worker
    process is (Ray sets OMP_NUM_THREADS to a worker's CPUs; the worker then calls
    torch.set_num_threads(train.cpus_per_worker))."""
    return child("finetune_throughput", ["--bare-only", json.dumps(spec), "--config", args.config,
                                         *sets(spec["overrides"])], env={"OMP_NUM_THREADS": str(spec["threads"])})


# ---------------------------------------------------------------------------- the Ray path


class LineClock(threading.Thread):
    """Polls a metrics.jsonl and records when each line first appeared (perf_counter)."""

    def __init__(self, path: Path, every: float = 0.05):
        super().__init__(daemon=True)
        self.path, self.every, self.lines = path, every, []
        self._done, self._buf, self._pos = threading.Event(), "", 0

    def run(self) -> None:
        while not self._done.is_set():
            self._poll()
            time.sleep(self.every)
        self._poll()

    def _poll(self) -> None:
        try:
            with open(self.path) as fh:
                fh.seek(self._pos)
                chunk = fh.read()
                self._pos = fh.tell()
        except FileNotFoundError:
            return
        now = time.perf_counter()
        *complete, self._buf = (self._buf + chunk).split("\n")
        self.lines += [(now, json.loads(x)) for x in complete if x.strip()]

    def stop(self) -> None:
        self._done.set()
        self.join()


def ray_path(cfg) -> dict:
    from coreecg.train.fit import fit, plan_run

    run_dir = cfg.train.run_dir
    clock = LineClock(run_dir / "metrics.jsonl")
    clock.start()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        result = fit(plan_run(cfg, "finetune"))
    t_end = time.perf_counter()
    clock.stop()
    timed = clock.lines
    epochs = [(t, x) for t, x in timed if x.get("kind") == "epoch"]
    steps = [(t, x) for t, x in timed if x.get("kind") == "step"]
    test = [t for t, x in timed if x.get("event") == "test"]
    rates = [x["samples_per_s"] for _, x in epochs]
    b = cfg.finetune.batch_size
    out = {
        "ray_samples_per_s": float(np.median(rates[1:])) if len(rates) > 1 else float(rates[0]),
        "per_epoch": [{k: round(float(x[k]), 4) for k in ("samples_per_s", "seconds", "val_seconds") if k in x}
                      for _, x in epochs],
        # rank 0's step lines (log_every=1): per-step rate incl. waiting for its next batch and the
        # DDP all-reduce; epochs after the first
        "step_lines_samples_per_s_median": float(np.median([x["samples_per_s"] for _, x in steps
                                                            if x["epoch"] >= 2])) if len(epochs) > 1 else None,
        "seconds_to_first_step": (steps[0][0] - t0) if steps else None,
        "seconds_total": t_end - t0,
        "steps": int(epochs[-1][1]["step"]) if epochs else 0,
        "val_auroc_last": epochs[-1][1].get("val_auroc") if epochs else None,
        "test_auroc": result.metrics["test"]["auroc"],
    }
    if len(epochs) > 1:
        span = epochs[-1][0] - epochs[0][0]                    # epoch 1's line -> epoch E's line
        n_steps = int(epochs[-1][1]["step"] - epochs[0][1]["step"])
        train_s = sum(x["seconds"] for _, x in epochs[1:])
        val_s = sum(x.get("val_seconds", 0.0) for _, x in epochs[1:])
        out["ray_wall"] = {
            "samples_per_s": n_steps * b / span, "seconds": span, "steps_s": train_s, "validation_s": val_s,
            "report_checkpoint_and_other_s": span - train_s - val_s,
            "note": "epochs 2..E, wall clock between the epoch lines of epoch 1 and epoch E: steps (the epoch "
                    "lines' seconds), rank-0 validation (val_seconds), and the rest (per-epoch report barrier + "
                    "checkpoint upload, epoch iterator start-up)"}
    if epochs and test:
        out["seconds_last_epoch_to_test_line"] = test[0] - epochs[-1][0]   # last report + finish()
    return out


# ---------------------------------------------------------------------------- driver


def main() -> None:
    p = parser(__doc__, "the tests' tiny model, 128 records, batch 8, 2 epochs, 2 bare steps, 8 evaluation windows")
    p.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"),
                   help="YAML over the paper defaults "
                        "(default: configs/quickstart.yaml; configs/paper.yaml = paper model)")
    p.add_argument("--set", action="append", default=[], help="a.b=value config override (repeatable)")
    p.add_argument("--mode", choices=("scratch", "finetune", "linear"), default="scratch")
    p.add_argument("--corpus", help="a labelled corpus folder (default: the embedded synthetic corpus)")
    p.add_argument("--records", type=int, default=1024, help="synthetic records (data.synthetic_records)")
    p.add_argument("--batch", type=int, default=32, help="global batch (finetune.batch_size)")
    p.add_argument("--workers", type=int, default=2, help="train.num_workers")
    p.add_argument("--cpus-per-worker", type=int, default=1, help="train.cpus_per_worker")
    p.add_argument("--epochs", type=int, default=3, help="Ray-path epochs (the first is start-up)")
    p.add_argument("--steps", type=int, default=10, help="bare timed steps")
    p.add_argument("--warmup", type=int, default=2, help="bare warm-up steps (not timed)")
    p.add_argument("--per-worker-steps", type=int, default=None,
                   help="timed steps of the one-worker-share bare run (default --steps; 0 skips it)")
    p.add_argument("--eval-windows", type=int, default=128, help="windows for predict() (0 skips)")
    p.add_argument("--no-ray", action="store_true", help="bare step and evaluation only")
    p.add_argument("--bare-only", metavar="SPEC", help=argparse.SUPPRESS)      # child process
    args = p.parse_args()
    if args.bare_only:
        emit(bare_rates(load_config(args.config, args.set), json.loads(args.bare_only)), one_line=True)
        return
    if args.quick:
        args.set = [*TINY, *args.set]
        args.records, args.batch, args.epochs, args.steps, args.warmup, args.eval_windows = 128, 8, 2, 2, 1, 8

    import ray

    from coreecg.cluster import init_ray
    from coreecg.data.corpus import load_manifest
    from coreecg.data.locate import training_corpus

    storage = Path(tempfile.mkdtemp(prefix="coreecg-ftbench-"))
    try:
        threads = args.workers * args.cpus_per_worker
        overrides = [f"finetune.batch_size={args.batch}", f"finetune.epochs={args.epochs}",
                     f"finetune.mode={args.mode}", f"train.num_workers={args.workers}",
                     f"train.cpus_per_worker={args.cpus_per_worker}", f"data.synthetic_records={args.records}",
                     *([f"data.corpus={Path(args.corpus).expanduser().resolve()}"] if args.corpus else []),
                     *args.set]
        cfg = load_config(args.config, overrides)
        with contextlib.redirect_stdout(sys.stderr):        # "building the synthetic corpus ..."
            init_ray(threads)
            corpus = training_corpus(cfg)
        ray.shutdown()                                      # no Ray beside the bare steps
        manifest = load_manifest(corpus)
        counts = (manifest.get("counts") or {}).get("windows") or {}
        if args.mode != "scratch":
            from coreecg.methods import CoReECG
            from coreecg.checkpoints import save_encoder

            torch.manual_seed(0)
            encoder = save_encoder(storage / "encoder.pt", CoReECG(cfg), cfg)
            overrides.append(f"finetune.encoder={encoder}")
            cfg = load_config(args.config, overrides)
        n_train = int(counts.get("train", 0))
        spe = (n_train // args.workers) // (args.batch // args.workers)
        spec = {"classes": len(manifest["class_names"]), "multilabel": bool(manifest["multilabel"]),
                "stored_samples": int(manifest["signal"]["shape"][-1]), "steps_per_epoch": spe,
                "warmup": args.warmup, "eval_crops": [3, 1], "overrides": overrides}
        m = cfg.encoders.coreecg                       # the ViT's sizes
        out: dict = {
            "config": {"file": str(Path(args.config).resolve().relative_to(REPO))
                       if Path(args.config).resolve().is_relative_to(REPO) else args.config,
                       "overrides": args.set, "mode": args.mode,
                       "model": {"embed_dim": m.embed_dim, "depth": m.depth, "num_heads": m.num_heads,
                                 "mlp_ratio": m.mlp_ratio, "patch_size": m.patch_size,
                                 "input_samples": cfg.model.input_samples, "leads": len(cfg.finetune.leads),
                                 "tokens": len(cfg.finetune.leads) * cfg.n_patches},
                       "global_batch": args.batch, "per_worker_batch": args.batch // args.workers,
                       "workers": args.workers, "cpus_per_worker": args.cpus_per_worker,
                       "bare_threads": threads, "epochs": args.epochs, "precision": cfg.train.precision,
                       "eval_batch_size": cfg.finetune.eval_batch_size, "eval_windows": args.eval_windows,
                       "corpus": str(corpus), "train_windows": n_train, "classes": spec["classes"],
                       "multilabel": spec["multilabel"], "steps_per_epoch": spe},
            **machine(),
        }

        load = {"before_bare": os.getloadavg()[0]}
        bare = run_bare_child(args, {**spec, "threads": threads, "batch": args.batch, "steps": args.steps,
                                     "eval_windows": args.eval_windows})
        out["bare_samples_per_s"] = bare["samples_per_s"]
        out["bare"] = bare
        out["config"]["parameters"] = bare["parameters"]
        out["config"]["trainable_parameters"] = bare["trainable_parameters"]
        if "eval_windows_per_s" in bare:
            out["eval_windows_per_s"] = {**bare.pop("eval_windows_per_s"), "threads": threads}
        per_steps = args.steps if args.per_worker_steps is None else args.per_worker_steps
        if per_steps and args.workers > 1:
            one = run_bare_child(args, {**spec, "threads": args.cpus_per_worker, "batch": args.batch // args.workers,
                                        "steps": per_steps, "eval_windows": args.eval_windows})
            ev = one.pop("eval_windows_per_s", {})
            out["bare_per_worker"] = {**one, "times_workers_samples_per_s": one["samples_per_s"] * args.workers}
            if ev:
                out["eval_windows_per_s_one_worker"] = {**ev, "threads": args.cpus_per_worker}

        if not args.no_ray:
            load["before_ray"] = os.getloadavg()[0]
            cfg = load_config(args.config, [*overrides, f"train.storage_path={storage}", "train.name=ft-bench",
                                            "train.log_every=1", "train.checkpoint_every_steps=0"])
            t_ray = time.perf_counter()
            init_ray(threads)                   # plan_run() then finds Ray up
            ray_init_s = time.perf_counter() - t_ray
            ray_out = ray_path(cfg)
            ray.shutdown()
            out["ray_samples_per_s"] = ray_out.pop("ray_samples_per_s")
            out["ratio"] = out["ray_samples_per_s"] / out["bare_samples_per_s"]
            out["seconds_to_first_step"] = ray_out.pop("seconds_to_first_step")
            out["ray"] = {"ray_init_seconds": ray_init_s, **ray_out}
            if "ray_wall" in ray_out:
                out["ray_wall_ratio"] = ray_out["ray_wall"]["samples_per_s"] / out["bare_samples_per_s"]
            if "bare_per_worker" in out:
                out["ratio_to_per_worker_times_workers"] = (
                    out["ray_samples_per_s"] / out["bare_per_worker"]["times_workers_samples_per_s"])
        load["after"] = os.getloadavg()[0]
        out["load_average_1min"] = load            # > cpu_count: something else shared the CPUs
        emit(out)
    finally:
        shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
