"""Inference over a Ray cluster: `coreecg.inference`'s per-record work, spread over N actors.

    from coreecg.inference.distributed import run_inference_ray
    result = run_inference_ray(loaded, items, workers=8, failures=failures)   # as run_inference

The driver only lists (file names, a corpus's shard names); reading, preprocessing and scoring
happen in a Ray Data `map_batches` over an actor pool of `workers` actors, each holding the
model once (one CPU and one torch thread each, or one GPU). An actor scores its batch of items
with `coreecg.inference.engine.run_inference` itself, so nothing here repeats a step; the driver puts
the records back in listing order.

Equal to one process, bit for bit on the CPU: a record's windows go through the same steps, and
its outputs do not depend on which records share its forward passes (every pass has the same
shape: `run_inference` says why; tests/test_inference_scale.py compares the two paths exactly).
On a GPU cuBLAS may choose kernels by more than the shape: equal there to float32 rounding.

A record that fails in an actor is a Failure row as in one process, never a crash of the job;
failures come back listing failures first, then records in listing order. With device "cuda"
the cluster must have a GPU per actor (`coreecg.cluster.check_gpus`: a ClusterError, not a pool
that waits); with "auto" the actors take a GPU each where the cluster has one per actor, else a
CPU (`coreecg.cluster.plan_actors`, its line on the `coreecg.inference` logger).
"""
from __future__ import annotations

import math
import pickle
import time
from typing import Any, Sequence

import numpy as np
import ray
import ray.data
import torch

from coreecg.cluster import check_gpus, find_devices, plan_actors, quiet_data
from coreecg.inference.engine import FORWARD_WINDOWS, Progress, inference_path, log, run_inference
from coreecg.inference.items import CorpusShard, Failure, InferenceResult
from coreecg.inference.model_input import input_spec

# Raw records per actor call, at least: few enough to balance N actors, enough that the last
# forward pass's fill (< batch_size windows, coreecg.inference.engine.run_inference) costs little.
RECORDS_PER_TASK = 16


class _Scorer:
    """A Ray Data actor: the model loaded once; a batch of pickled items -> one row per record
    (scored or failed), keyed by (item index, position in the item)."""

    def __init__(self, model: list, embeddings: bool, batch_size: int | None, device: str,
                 precision: str | None = None):
        torch.set_num_threads(1)            # one core per actor: N actors, N cores, no oversubscription
        self.loaded = ray.get(model[0])     # put once by the driver; a list, so Ray hands over the ref
        self.embeddings, self.batch_size, self.device = embeddings, batch_size, device
        self.precision = precision          # resolved in the actor: its processor's units decide auto

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        items = [pickle.loads(b) for b in batch["item"]]
        index = batch["index"]
        r = run_inference(self.loaded, items, embeddings=self.embeddings, batch_size=self.batch_size,
                          device=self.device, progress_every_s=math.inf, precision=self.precision)
        # An item that gave no record gave exactly one Failure (an empty shard too: "no records"),
        # in item order (InferenceResult.item).
        given = set(r.item.tolist())
        failed = [i for i in range(len(items)) if i not in given]
        if len(failed) != len(r.failures):
            raise RuntimeError(f"{len(failed)} items gave no record but {len(r.failures)} failures came back: "
                               "coreecg.inference.reading.prepared_records broke its one-failure-per-item rule")
        n, k = len(r.record_id), len(failed)
        pos = np.zeros(n, np.int64)
        if n:                                 # position of a record within its item: 0, 1, ... per run
            starts = np.flatnonzero(np.concatenate([[True], np.diff(r.item) != 0]))
            pos = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
        out = {
            "index": np.concatenate([index[r.item], index[failed]]).astype(np.int64),
            "pos": np.concatenate([pos, np.zeros(k, np.int64)]).astype(np.int64),
            "record_id": np.array([*r.record_id, *(f.record_id for f in r.failures)], dtype=object),
            "path": np.array([*r.path, *(f.path for f in r.failures)], dtype=object),
            "reason": np.array([""] * n + [f.reason for f in r.failures], dtype=object),
            "windows": np.concatenate([r.windows, np.zeros(k, np.int64)]),
        }
        if r.probs is not None:
            out["probs"] = np.concatenate([r.probs, np.full((k, r.probs.shape[1]), np.nan)])
        if r.embeddings is not None:
            out["embedding"] = np.concatenate([r.embeddings, np.full((k, r.embeddings.shape[1]), np.nan, np.float32)])
        out["precision"] = np.array([r.precision] * (n + k), dtype=object)
        out["precision_reason"] = np.array([r.precision_reason] * (n + k), dtype=object)
        return out


def run_inference_ray(loaded: Any, items: Sequence[Any], *, workers: int, embeddings: bool = False,
                      batch_size: int | None = None, device: str = "cpu", failures: Sequence[Failure] = (),
                      records_per_task: int | None = None, progress_every_s: float = 5.0,
                      precision: str | None = None) -> InferenceResult:
    """`coreecg.inference.run_inference` on a Ray cluster (joined or started by the caller:
    coreecg.cluster.init_ray), with `workers` actors; the same InferenceResult.

    device: "cpu" (an actor takes one CPU), "cuda" (one GPU) or "auto" (GPUs where the cluster
    has one per worker, else CPUs: coreecg.cluster.plan_actors). records_per_task: raw records per
    actor call (default RECORDS_PER_TASK or 2 forward passes' windows, the larger; a corpus
    shard is a task of its own). Progress: the `coreecg.inference` logger, as tasks come back.
    precision: as run_inference's, resolved in each actor (its processor's units; the model is
    prepared and checked once per actor).
    """
    if workers < 1:
        raise ValueError(f"workers={workers}: must be >= 1")
    if device == "auto":                        # the GPUs of the cluster the caller joined or started
        device, lines = plan_actors("auto", workers, find_devices(join=False))
        for line in lines:
            log.info("%s", line)
    if records_per_task is not None and records_per_task < 1:
        raise ValueError(f"records_per_task={records_per_task}: must be >= 1")
    spec = input_spec(loaded)                                  # a bad model fails here, before any actor
    if not str(device).startswith("cuda"):  # a refused path too (a GPU actor resolves its own)
        inference_path(loaded, "cpu", precision, spec)
    t0 = time.perf_counter()
    if not items:               # nothing to spread: the one-process result, its empty arrays shaped alike
        return run_inference(loaded, [], embeddings=embeddings, batch_size=batch_size, device=device,
                             failures=failures, progress_every_s=math.inf, precision=precision)
    quiet_data()
    per_task = records_per_task or max(RECORDS_PER_TASK, 2 * (batch_size or FORWARD_WINDOWS))
    if any(isinstance(it, CorpusShard) for it in items):
        per_task = 1
    rows = [{"index": i, "item": pickle.dumps(it)} for i, it in enumerate(items)]
    tasks = max(1, min(len(rows), math.ceil(len(rows) / per_task)))
    actors = min(workers, tasks)                                # no idle actor holding a model
    gpu = str(device).startswith("cuda")
    if gpu:
        check_gpus(actors, f"--device cuda with {actors} workers (one GPU each)",
                   "lower --workers to the cluster's GPUs, or use --device cpu", joined_may_wait=False)
    ds = ray.data.from_items(rows, override_num_blocks=tasks)
    scored = ds.map_batches(
        _Scorer, batch_size=per_task, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        fn_constructor_kwargs={"model": [ray.put(loaded)], "embeddings": embeddings,
                               "batch_size": batch_size, "device": str(device), "precision": precision},
        num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0)
    result = _gather(_collect(scored, len(items), progress_every_s), spec, embeddings, failures)
    result.seconds = time.perf_counter() - t0
    return result


def _collect(scored: Any, n_items: int, progress_every_s: float) -> list[dict[str, np.ndarray]]:
    """The actors' rows, part by part as they finish tasks (`scored`: the Ray Dataset of them),
    progress logged over the `n_items` items -> the parts."""
    parts, done, failed = [], set(), 0
    progress = Progress(n_items, progress_every_s)
    for part in scored.iter_batches(batch_size=None, batch_format="numpy"):
        parts.append(part)
        done.update(part["index"].tolist())
        failed += int((part["reason"] != "").sum())
        progress.update(len(done), failed)
    progress.update(len(done), failed, force=True)
    return parts


def _gather(parts: list[dict[str, np.ndarray]], spec: Any, embeddings: bool, failures: Sequence[Failure]
            ) -> InferenceResult:
    """The actors' rows (at least one part), in any order -> one InferenceResult in listing order."""
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.lexsort((cols["pos"], cols["index"]))
    ok = order[cols["reason"][order] == ""]
    bad = order[cols["reason"][order] != ""]
    want_emb = embeddings or spec.kind == "encoder"
    return InferenceResult(
        record_id=[str(x) for x in cols["record_id"][ok]], path=[str(x) for x in cols["path"][ok]],
        probs=cols["probs"][ok].astype(np.float64) if spec.kind == "classifier" else None,
        embeddings=cols["embedding"][ok].astype(np.float32) if want_emb else None,
        windows=cols["windows"][ok].astype(np.int64), class_names=spec.class_names,
        failures=[*failures, *(Failure(str(cols["record_id"][j]), str(cols["path"][j]), str(cols["reason"][j]))
                               for j in bad)],
        item=cols["index"][ok].astype(np.int64), regression=bool(getattr(spec, "regression", False)),
        # the actors' paths (one, unless their processors differ)
        precision=",".join(sorted({str(x) for x in cols["precision"]})) or "fp32",
        precision_reason="; ".join(sorted({str(x) for x in cols["precision_reason"]})))
