"""End-to-end pretraining throughput: the Ray Train + Ray Data path against the bare step.

    python -m bench.pretrain_throughput                     # paper model, batch 32, all CPUs
    python -m bench.pretrain_throughput --config configs/quickstart.yaml --epochs 3
    python -m bench.pretrain_throughput --quick             # tiny model, 64 records: a smoke run
    python -m bench.pretrain_throughput --corpus corpora/ptbxl corpora/icbeb --steps-total 300

On a GPU (one worker holding the GPU and min(8, CPUs - 2) CPUs, the other CPUs left to Ray Data):

    python -m bench.pretrain_throughput --device cuda --batch 256 --corpus corpora/ptbxl corpora/icbeb --steps-total 300

Prints one JSON object, every figure measured in this run on this machine:
1. training samples/s: `coreecg.train.fit.fit` (what `jobs/pretrain.py` runs:
   TorchTrainer, 1 worker, the training dataset as fit reads it (one corpus: materialised below
   `data.cache_in_memory_gb`; a mixture: always streamed), float16 ingest, per-epoch
   crops/shuffle, checkpoints at epoch ends; probe off) in steady state (the median of the
   epochs after the first), against a bare `PretrainStep` loop on the same config, batch,
   device and thread count fed from memory. Goal: ratio >= 0.9. The bare step runs in a fresh
   process without Ray and with OMP_NUM_THREADS set, like a Train worker (unset, the same step
   measured 18 % slower here). On CPU the worker holds every core (`train.cpus_per_worker` =
   CPUs); with `--device cuda` it holds the GPU (`train.use_gpu=true`) and min(8, CPUs - 2)
   CPUs, and the bare step runs on the GPU with as many threads. Also the fit's wall seconds,
   the optimiser steps it ran and the whole run's samples/s (every sample / fit wall: start-up,
   the first epoch and the checkpoints included).
2. input-pipeline headroom: the windows/s ingest alone gives on the same corpus (or mixture),
   source and batch (`bench.common.worker_source` / the mixture's streamed files through
   `ingest_pass`, best of 2 epochs, no model), over the windows/s the training loop consumed
   (the steady-state samples/s of 1.). Below ~1.2 the data path, not the step, sets the pace.
3. seconds from launching `python jobs/pretrain.py` (a fresh Python, a fresh local Ray, the
   corpus already cached) to its first training step in metrics.jsonl (on cuda with
   train.use_gpu=true and the same one worker).

--corpus PATH [PATH ...]: built corpora (jobs/preprocess.py) instead of the embedded synthetic
one; several are a mixture (data.corpus as a list, docs/mixtures.md). The bare step reads its
windows from the first corpus's train split. --steps-total N: optim.epochs chosen (at least 2)
so that the Ray path runs at least N optimiser steps (train windows // batch per epoch, from
the manifests); it overrides --epochs.
Ingest alone (the training dataset against plain pyarrow) is `python -m bench.ingest`.

Beside the medians, the whole window (issue 41; `bench.common.step_summary`): `training.bare_step`
times every bare step, warm-up included (host clock on CPU, CUDA events on a GPU: no added sync),
with `samples_per_s_whole`, `samples_per_s_after_first`, `first_step_s`, `step_s`, `slow_steps`
and torch.compile's `compilations_total` / `compilations_after_first_step`;
`training.ray_train_epochs` does the same with the Ray path's epochs (their training seconds, the
first epoch included: `samples_per_s_whole`, `slow_epochs`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import (REPO, TINY, child, compile_diff, compile_snapshot, config_args, emit, ingest_pass, job,
                          job_env, machine, parser, progress, sets, step_summary, sync, worker_source)
from coreecg.config import load_config


def bare_step_rate(cfg, windows: np.ndarray, steps: int, warmup: int, threads: int, device: str = "cpu",
                   unpadded: bool = False) -> dict:
    """PretrainStep alone on in-memory crops on `device` (no Ray, no data loading) -> samples/s of
    the timed steps (`samples_per_s`, one clock around them, as before) and every step's time,
    warm-up included (`bench.common.step_summary`: the whole window, the median, slow steps),
    with torch.compile's compilations (in all, and after the first step)."""
    from coreecg.methods import build_method
    from coreecg.train.ingest import memory_epoch_batches, to_model_input
    from coreecg.train.step import PretrainStep, Schedule

    dev = torch.device(device)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    step = PretrainStep(build_method(cfg).to(dev), cfg, Schedule(1000, 1, 0))
    step.unpadded = unpadded                    # as the Ray path decides it, from the manifest
    gen = torch.Generator().manual_seed(0)      # on the host, as in the training loop
    data = torch.from_numpy(windows)
    per_epoch = len(data) // cfg.optim.batch_size
    if per_epoch == 0:
        raise SystemExit(f"{len(data)} windows: not one batch of {cfg.optim.batch_size}")
    cuda = dev.type == "cuda"
    compiles = [compile_snapshot()]

    def mark():
        """A step boundary: the host clock on CPU; on a GPU an event on the stream (no host sync,
        as the loop runs: the steps' times are read once the window is over)."""
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def run(first: int, n: int, marks: list) -> None:
        batches = None
        for i in range(first, first + n):
            if batches is None or i % per_epoch == 0:
                batches = memory_epoch_batches(data, cfg.optim.batch_size, i // per_epoch, 0, dev)
            signal, uid = next(batches)
            step(to_model_input(signal, uid, 0, 0, cfg.data.crop_samples), generator=gen)
            if i == 0:      # compilation happens on the host, within the call
                compiles.append(compile_snapshot())
            marks.append(mark())

    marks = [mark()]
    run(0, warmup, marks)
    sync(dev)
    # One clock around all timed steps, as the loop runs them: no device sync between steps.
    t = time.perf_counter()
    run(warmup, steps, marks)
    sync(dev)
    rate = cfg.optim.batch_size * steps / (time.perf_counter() - t)
    compiles.append(compile_snapshot())
    step_s = ([a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])] if cuda
              else [b - a for a, b in zip(marks, marks[1:])])
    total, after_first = compile_diff(compiles[0], compiles[-1]), compile_diff(compiles[1], compiles[-1])
    return {"samples_per_s": rate, **step_summary(step_s, cfg.optim.batch_size, warmup),
            "step_clock": "CUDA events" if cuda else "host",
            "compilations_total": total["graphs"], "compilations_after_first_step": after_first["graphs"],
            "recompile_reasons_after_first_step": after_first["recompile_reasons"]}


def epoch_summary(epochs: list[dict]) -> dict | None:
    """The Ray path's epochs as `bench.common.step_summary` steps (the first epoch as the warm-up):
    its training seconds (metrics.jsonl's epoch `seconds`: the steps, no evaluation or checkpoint)
    and samples (`samples_per_s` x `seconds`) -> the whole window of every epoch, the first
    included, beside the median of the later ones; slow epochs. None without timed epochs."""
    if not epochs or any(float(x.get("seconds", 0)) <= 0 for x in epochs):
        return None
    seconds = [float(x["seconds"]) for x in epochs]
    samples = [round(float(x["samples_per_s"]) * s) for x, s in zip(epochs, seconds)]
    out = step_summary(seconds, samples, warmup=1 if len(epochs) > 1 else 0)
    rates = [float(x["samples_per_s"]) for x in epochs]
    out["samples_per_s_median"] = float(np.median(rates[1:] or rates))    # ray_train_samples_per_s, as before
    return {("epoch_s" if k == "step_s" else "slow_epochs" if k == "slow_steps" else
             k.replace("first_step", "first_epoch").replace("steps", "epochs")): v for k, v in out.items()}


def ray_path(cfg) -> dict:
    """Fit `cfg` on Ray Train -> its plan, wall seconds and epoch records."""
    from coreecg.train.fit import fit, plan_run

    plan = plan_run(cfg, "pretrain")
    t0 = time.perf_counter()
    fit(plan)
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in (cfg.train.run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"plan": plan, "wall_s": wall, "epochs": [x for x in lines if x.get("kind") == "epoch"]}


def ingest_rate(plan, cfg, batch: int, epochs: int = 2) -> dict:
    """Windows/s of ingest alone from the source the fit read (the same corpus or mixture, the
    same materialised/streamed choice), best of `epochs` passes; -> the figures."""
    if plan.mixture is not None:
        from coreecg.train.mixture import mixture_files

        source = mixture_files(plan.mixture)
    else:
        source = worker_source(plan.corpus, cfg.data.cache_in_memory_gb, cfg.train.seed)
    passes = [ingest_pass(source, batch, e, cfg.data.shuffle_buffer, cfg.data.crop_samples, cfg.train.seed)
              for e in range(epochs)]
    return {"windows_per_s": max(x["windows_per_s"] for x in passes), "streamed": passes[0]["streamed"],
            "mixture": plan.mixture is not None, "windows_per_s_per_epoch": [x["windows_per_s"] for x in passes]}


def train_windows(corpora: list[Path]) -> int:
    """Train windows of the corpora together (the manifests' split sizes; a mixture's epoch is
    their sum before duplicates are dropped)."""
    from coreecg.data.reading import split_rows

    return sum(split_rows(c, "train") for c in corpora)


def time_to_first_step(overrides: list[str], storage: Path) -> float:
    run = storage / "first-step"
    shutil.rmtree(run, ignore_errors=True)
    cmd = job("pretrain", *sets([*overrides, f"train.storage_path={storage}", "train.name=first-step",
                                 "train.log_every=1"]))
    log = storage / "first-step.log"
    t0 = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(drop=("RAY_ADDRESS",)), stdout=out,
                                stderr=subprocess.STDOUT)
    metrics = run / "metrics.jsonl"
    try:
        while time.perf_counter() - t0 < 600:
            if metrics.is_file() and '"kind": "step"' in metrics.read_text():
                return time.perf_counter() - t0
            if proc.poll() is not None:
                raise RuntimeError(f"jobs/pretrain.py exited with {proc.returncode} before its first step:\n"
                                   + log.read_text(errors="replace")[-3000:])
            time.sleep(0.1)
        raise TimeoutError("no training step within 600 s")
    finally:
        proc.kill()       # the job this benchmark started; its first step is all it was for
        proc.wait()


def main() -> None:
    p = parser(__doc__, "the tests' tiny model, 64 records, batch 8, 2 epochs, 2 bare steps")
    config_args(p)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: train.use_gpu=true, one worker with the GPU; the bare step on the GPU")
    p.add_argument("--corpus", nargs="+", metavar="PATH",
                   help="built corpora to train on (several: a mixture); default: the embedded synthetic one")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--records", type=int, default=256, help="synthetic records in the benchmark corpus")
    p.add_argument("--epochs", type=int, default=2, help="Ray-path epochs (the first is start-up)")
    p.add_argument("--steps-total", type=int, metavar="N",
                   help="optim.epochs (>= 2) so that the Ray path runs at least N steps; overrides --epochs")
    p.add_argument("--steps", type=int, default=5, help="bare-step timed steps")
    p.add_argument("--no-first-step", action="store_true", help="skip the time-to-first-step job")
    p.add_argument("--bare-only", metavar="CORPUS", help=argparse.SUPPRESS)   # child process
    p.add_argument("--unpadded", action="store_true", help=argparse.SUPPRESS)  # child: as the Ray path decided
    p.add_argument("--threads", type=int, help=argparse.SUPPRESS)              # child process
    args = p.parse_args()
    cpus = os.cpu_count() or 1
    cuda = args.device == "cuda"
    # The Train worker's CPUs (its torch threads): every core on CPU, as before; on a GPU the
    # step needs few, and Ray Data's read/decode tasks get the rest (init_ray reserves 2 more).
    threads = args.threads or (max(1, min(8, cpus - 2)) if cuda else cpus)
    if args.quick and not args.bare_only:
        args.set = [*TINY, *args.set]
        args.batch, args.records, args.steps = 8, 64, 2
    if args.bare_only:
        from coreecg.data.reading import read_split

        if cuda and not torch.cuda.is_available():
            raise SystemExit("--device cuda: this process sees no CUDA device")
        cfg = load_config(args.config, [f"optim.batch_size={args.batch}", *args.set])
        # float16 as stored, as training batches arrive; at most 4 batches, spread over the split
        windows = read_split(args.bare_only, "train", columns=["signal"], max_windows=4 * args.batch,
                             as_stored=True)["signal"]
        bare = bare_step_rate(cfg, windows, args.steps, 1 if not cuda else 3, threads, args.device,
                              unpadded=args.unpadded)
        emit({"bare_step_samples_per_s": bare.pop("samples_per_s"), "bare_step": bare}, one_line=True)
        return

    import ray

    from coreecg.cluster import check_gpus, init_ray
    from coreecg.data.locate import synthetic_corpus

    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    corpora = [Path(c).expanduser().resolve() for c in args.corpus or []]
    corpus_set = ([f"data.corpus={corpora[0]}"] if len(corpora) == 1 else
                  [f"data.corpus=[{', '.join(str(c) for c in corpora)}]"] if corpora else [])
    storage = Path(tempfile.mkdtemp(prefix="coreecg-bench-"))
    common = [f"optim.batch_size={args.batch}", f"data.synthetic_records={args.records}", "train.eval_every_epochs=0",
              "train.checkpoint_every_steps=0", *corpus_set, *args.set]
    # on CPU the first-step job keeps its config's workers (as before); on a GPU one worker holds the one GPU
    workers = ["train.num_workers=1", f"train.cpus_per_worker={threads}", *(["train.use_gpu=true"] if cuda else [])]
    init_ray(threads)     # before the synthetic corpus, whose first build is a Ray Data job
    check_gpus(1 if cuda else 0, "--device cuda", "use --device cpu")     # before a corpus is built
    corpus = corpora[0] if corpora else synthetic_corpus(load_config(args.config, common))
    epochs = args.epochs
    if args.steps_total:
        windows = train_windows(corpora or [corpus])
        if windows // args.batch == 0:
            raise SystemExit(f"{windows} train windows: not one batch of {args.batch}")
        epochs = max(2, math.ceil(args.steps_total / (windows // args.batch)))
    cfg = load_config(args.config, [*common, f"train.storage_path={storage}", f"optim.epochs={epochs}",
                                    *workers, "train.name=throughput"])
    ray_run = ray_path(cfg)
    per_epoch = [x["samples_per_s"] for x in ray_run["epochs"]]
    ray_rate = float(np.median(per_epoch[1:])) if len(per_epoch) > 1 else float(per_epoch[0])
    ray_epochs = epoch_summary(ray_run["epochs"])
    steps_run = int(ray_run["epochs"][-1]["step"])
    progress({"ray_train_samples_per_s_per_epoch": per_epoch, "steps": steps_run, "fit_wall_s": ray_run["wall_s"]})
    errors = {}       # a failed later part keeps the figures above (a GPU run is seldom repeated)
    try:
        ingest = ingest_rate(ray_run["plan"], cfg, args.batch)
        progress({"ingest_windows_per_s": ingest["windows_per_s"]})
    except Exception as e:      # noqa: BLE001  reported in the JSON, with the training figures
        ingest, errors["ingest"] = None, f"{type(e).__name__}: {e}"[-3000:]
        progress({"ingest_error": errors["ingest"]})
    ray.shutdown()
    # The Ray path drops attention masks only when every training corpus counts no padded window
    # (coreecg.train.pretraining.task_from_plan); the bare step, fed from the first corpus, does the same.
    from coreecg.data.corpus import unpadded_split

    unpadded = all(unpadded_split(c, "train") for c in (corpora or [corpus]))
    # Ray sets OMP_NUM_THREADS to a worker's CPUs; without it the same step measured 18 % slower.
    bare = None
    try:
        bare = child("pretrain_throughput", [
            "--bare-only", str(corpus), *(["--unpadded"] if unpadded else []),
            "--batch", str(args.batch), "--steps", str(args.steps), "--device",
            args.device, "--threads", str(threads), *(["--config", args.config] if args.config else []),
            *sets(args.set)], env={"OMP_NUM_THREADS": str(threads)})
        bare_rate = bare["bare_step_samples_per_s"]
        progress({"bare_step_samples_per_s": bare_rate, **{k: bare["bare_step"][k] for k in (
            "samples_per_s_whole", "first_step_s", "compilations_after_first_step")}})
    except RuntimeError as e:
        bare_rate, errors["bare_step"] = None, str(e)[-3000:]
        progress({"bare_step_error": errors["bare_step"]})
    first_step = None
    try:
        if not args.no_first_step:
            first_step = time_to_first_step([*common, "optim.epochs=1", f"data.cache_dir={cfg.data.cache_dir}",
                                             *(workers if cuda else [])], storage)
    except (RuntimeError, TimeoutError) as e:
        first_step, errors["first_step"] = None, str(e)[-3000:]
        progress({"first_step_error": errors["first_step"]})
    shutil.rmtree(storage, ignore_errors=True)
    samples = steps_run * args.batch * cfg.train.num_workers
    emit({"benchmark": "pretrain_throughput", **machine(args.device),
          "gpu_name": torch.cuda.get_device_name() if cuda else None,
          "config": args.config or "paper defaults", "overrides": args.set, "batch": args.batch,
          "corpus": [str(c) for c in corpora] if corpora else f"synthetic ({args.records} records)",
          "train_windows": ray_run["plan"].train_windows, "worker_cpus": threads,
          "epochs": epochs, "steps_per_epoch": ray_run["plan"].steps_per_epoch, "steps_total_asked": args.steps_total,
          "training": {"ray_train_samples_per_s": ray_rate, "ray_train_samples_per_s_per_epoch": per_epoch,
                       "bare_step_samples_per_s": bare_rate, "ratio": ray_rate / bare_rate if bare_rate else None,
                       "goal": 0.9,
                       "steps": steps_run, "fit_wall_s": ray_run["wall_s"],
                       "ray_train_samples_per_s_whole_run": samples / ray_run["wall_s"],
                       # issue 41: the whole window beside the medians (bench.common.step_summary)
                       "ray_train_samples_per_s_median": ray_rate,
                       "ray_train_samples_per_s_whole": ray_epochs["samples_per_s_whole"] if ray_epochs else None,
                       "bare_step_samples_per_s_whole": bare["bare_step"]["samples_per_s_whole"] if bare else None,
                       "ray_train_epochs": ray_epochs, "bare_step": bare["bare_step"] if bare else None},
          "input_pipeline": {"consumed_windows_per_s": ray_rate,
                             **({"ingest_windows_per_s": ingest["windows_per_s"],
                                 "headroom": ingest["windows_per_s"] / ray_rate,
                                 "ingest_windows_per_s_per_epoch": ingest["windows_per_s_per_epoch"],
                                 "streamed": ingest["streamed"], "mixture": ingest["mixture"]} if ingest else {})},
          "seconds_to_first_step": first_step, **({"errors": errors} if errors else {})})


if __name__ == "__main__":
    main()
