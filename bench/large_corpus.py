"""A corpus larger than memory: preprocessing killed and resumed, then streamed epochs.

    python -m bench.large_corpus --records 100000 --workdir /tmp/large   # the issue's size (6.0 GB of windows)
    python -m bench.large_corpus --records 3000 --workdir /tmp/lc         # about 4 min on 2 cores
    python -m bench.large_corpus --records 100000 --workdir /tmp/large --reuse-corpus --epochs 0   # (b), (c) again
    python -m bench.large_corpus --quick --workdir /tmp/lcq               # 512 records, no epoch: a smoke run

Size: a synthetic record is 10 s at 500 Hz (fixed by the source; no config key lengthens it),
so it gives one stored window of 12 leads x 2,500 samples x float16 = 60,000 B whatever
`data.preprocess.window_s` is (shorter windows only cut it in more pieces). The corpus size is
therefore set by --records alone: 100,000 records are 6.0e9 B of windows (6.0 GB, 5.59 GiB;
6 GiB needs 107,375). The figures give the size computed from the config as `window_bytes`.

All on one Ray cluster of this script's own (`coreecg.cluster.init_ray`, as jobs/pretrain.py's
private cluster would be); the jobs join it through RAY_ADDRESS.

(a) `jobs/preprocess.py --source synthetic --set data.synthetic_records=N --set
    data.shard_records=S` (S=256: 391 shards at 100k) is SIGKILLed once K shard markers exist
    (default a third of the shards), then re-run to completion. Checked: exit 0; the resumed run
    skipped every shard whose marker existed after the kill, and those shards' markers and files
    kept their mtime and the sha256 their marker holds; every shard has one marker and its files,
    no other shard file exists; rows == records x windows per record; no record id is in two
    files; every file matches the manifest's sha256. Figures: records/s and records/s/core
    (cores: CPUs this process may run on, at most Ray's CPUs) of the resumed run and overall,
    bytes on disk, and temporary files a killed write left behind.
(b) Ingest alone (`bench.common.ingest_pass`, as `python -m bench.ingest` measures it):
    `coreecg.train.ingest.training_dataset` with `data.cache_in_memory_gb` below the train
    split's size (so it streams: `ShardFiles`, which `streamed` checks), read through
    `epoch_batches` as rank 0 of one Train worker reads it:
    windows/s and time to the first batch. `to_model_input` (crop + float32, which the step does
    on the training device) runs on each batch but is timed apart. Then `jobs/pretrain.py
    --corpus` for --epochs of a tiny model (the sizes of tests/helpers.TINY) with the same cache
    setting: time to the probe at init and to the first step (from the run's metrics.jsonl),
    samples/s per epoch.
(c) Plain pyarrow over the same train files (ParquetFile.iter_batches + decode to float32) in
    this process, before and after (b)'s ingest pass, so both see the same page cache; the
    ratio is ingest over the faster of the two.
Per phase, sampled every 0.5 s: RSS and PSS summed over this process and all its descendants
(Ray's head processes and workers, the jobs; PSS counts shared object-store pages once), their
CPU seconds (this process / Ray workers / other: raylet, GCS, job drivers), object-store bytes in
use (peak) and bytes spilled during the phase. CPU us per window compares ingest and pyarrow
apart from the machine's load, which wall-clock rates on a shared machine are not.

(d) The leakage guard (docs/leakage.md) with the corpus as a pretraining corpus: the fingerprint
    pass over every window (what building it adds), then the guard a fine-tuning runs (its train
    split against a downstream corpus's val and test: --downstream, and the corpus's own),
    seconds each. `--leakage-only` skips (b), (c) and the epochs. Its figure, on a 100k-window
    corpus written by `--direct` (see direct_corpus) in minutes:
    python -m bench.large_corpus --direct --leakage-only --records 100000 --workdir /tmp/lk \
        --downstream corpora/ptbxl

Prints one JSON object; exits 1 when a resume check fails. Runtime on 2 idle cores: preprocessing
about 21 ms per record per core (100k: about 20 min); the tiny model's epoch on CPU is bound by
its steps, not by ingest (tens of windows/s per core: 80k train windows take tens of minutes).
"""
from __future__ import annotations

import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import torch  # noqa: F401  here: decode_signals imports it on first use, which must not fall in a timed pass

from bench.common import REPO, TINY, emit, ingest_pass, job, job_env, parser, pyarrow_pass, worker_source
from coreecg.config import DataConfig
from coreecg.data.corpus import SIGNAL_DTYPE, load_manifest, split_files, verify_corpus
from coreecg.files import sha256_file
from coreecg.data.pipeline import STATE_DIR
from coreecg.data.sources.synthetic import SyntheticSource
from coreecg.data.splits import SPLITS

GB = 1e9


# ---------------------------------------------------------------------------- memory


class Monitor:
    """Memory and CPU of this process tree and the object store, sampled in a thread during a `with`.

        with Monitor(gcs_address) as mon:
            work()
        mon.figures()   # {"peak_rss_gb", "peak_pss_gb", "pss_peak_by_tenth_gb", "pss_at_peak_gb",
                        #  "object_store_peak_gb", "spilled_gb", "cpu_s", "samples"}

    CPU seconds are evidence of where a phase's work goes that the machine's load does not
    change (wall-clock rates on a shared machine do); a process that ends between two samples
    loses its last interval.
    """

    def __init__(self, gcs_address: str, interval_s: float = 0.5):
        from ray._private.internal_api import get_state_from_address

        self._state = get_state_from_address(gcs_address)
        self._root = psutil.Process()
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.samples: list[tuple[float, int, int, int, int]] = []   # (t, rss, pss, store used, spilled total)
        self._cpu: dict[int, list] = {}     # pid -> [role, cpu s at phase start (0 if started later), cpu s now]
        self._at_peak: Counter = Counter()  # PSS by process name at the PSS peak

    def _role(self, p: psutil.Process) -> str:
        if p.pid == self._root.pid:
            return "this_process"
        return "ray_workers" if p.name().startswith("ray::") else "other"   # raylet, gcs, job drivers

    def _sample(self) -> None:
        from ray._private.internal_api import get_memory_info_reply

        first = not self.samples
        by_name: Counter = Counter()
        rss = 0
        for p in [self._root, *self._root.children(recursive=True)]:
            try:
                with p.oneshot():
                    m, c, role, name = p.memory_full_info(), p.cpu_times(), self._role(p), p.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue   # a worker that ended between listing and reading
            rss += m.rss
            by_name[name] += m.pss
            # the role as last seen: a Ray worker is "python" until it sets its title
            entry = self._cpu.setdefault(p.pid, [role, c.user + c.system if first else 0.0, 0.0])
            entry[0], entry[2] = role, c.user + c.system
        pss = sum(by_name.values())
        if not self.samples or pss >= max(s[2] for s in self.samples):
            self._at_peak = by_name
        store = get_memory_info_reply(self._state).store_stats
        self.samples.append((time.perf_counter(), rss, pss, store.object_store_bytes_used, store.spilled_bytes_total))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> "Monitor":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def cpu_s(self) -> dict[str, float]:
        out = dict.fromkeys(("this_process", "ray_workers", "other"), 0.0)
        for role, start, now in self._cpu.values():
            out[role] += now - start
        return {k: round(v, 2) for k, v in out.items()}

    def figures(self) -> dict:
        t, rss, pss, used, spilled = (np.array(c, dtype=np.float64) for c in zip(*self.samples))
        tenth = np.minimum((10 * (t - t[0]) / max(t[-1] - t[0], 1e-9)).astype(int), 9)
        return {"peak_rss_gb": round(rss.max() / GB, 3), "peak_pss_gb": round(pss.max() / GB, 3),
                # a stream that leaks keeps growing from tenth to tenth of the phase
                "pss_peak_by_tenth_gb": [round(pss[tenth == i].max() / GB, 2) if (tenth == i).any() else None
                                         for i in range(10)],
                "pss_at_peak_gb": {name: round(b / GB, 2) for name, b in self._at_peak.most_common(6)},
                "object_store_peak_gb": round(used.max() / GB, 3),
                "spilled_gb": round((spilled[-1] - spilled[0]) / GB, 3), "cpu_s": self.cpu_s(), "samples": len(t)}


# ---------------------------------------------------------------------------- (a) preprocessing


def snapshot(corpus: Path) -> dict[str, dict]:
    """Every shard marker now on disk: {marker name: {"mtime_ns", "files": {path: {sha256, mtime_ns}}}}."""
    out = {}
    for m in sorted((corpus / STATE_DIR).glob("shard-*.json")):
        marker = json.loads(m.read_text())    # written atomically: never half a file
        out[m.name] = {"mtime_ns": m.stat().st_mtime_ns,
                       "files": {f["path"]: {"sha256": f["sha256"], "mtime_ns": (corpus / f["path"]).stat().st_mtime_ns}
                                 for f in marker["files"]}}
    return out


def check_corpus(corpus: Path, n_shards: int, expected_windows: int, kept: dict[str, dict]) -> dict[str, list]:
    """What is wrong with a finished corpus (empty lists: nothing); `kept` is the snapshot of
    the shards the resumed run must have left alone."""
    manifest = load_manifest(corpus)
    problems: dict[str, list] = {}
    now = snapshot(corpus)
    problems["skipped_shards_touched"] = [
        name for name, before in kept.items()
        if now.get(name, {}).get("mtime_ns") != before["mtime_ns"]
        or any(now[name]["files"].get(p, {}).get("mtime_ns") != f["mtime_ns"]
               or sha256_file(corpus / p) != f["sha256"] for p, f in before["files"].items())]
    problems["markers_missing"] = sorted(set(f"shard-{i:05d}.json" for i in range(n_shards)) - set(now))
    listed = [s["path"] for s in manifest["shards"]]
    on_disk = [str(p.relative_to(corpus)) for s in SPLITS for p in (corpus / s).glob("shard-*.parquet")]
    problems["files_listed_twice"] = [p for p, n in Counter(listed).items() if n > 1]
    problems["files_missing"] = sorted(set(listed) - set(on_disk))
    problems["files_not_listed"] = sorted(set(on_disk) - set(listed))
    problems["files_bad_sha256"] = verify_corpus(corpus)
    rows = sum(pq.ParquetFile(corpus / p).metadata.num_rows for p in listed)
    if not rows == manifest["counts"]["windows_total"] == expected_windows:
        problems["rows"] = [{"files": rows, "manifest": manifest["counts"]["windows_total"],
                             "expected": expected_windows}]
    files_of: dict[str, set] = {}
    for p in listed:
        for rid in set(pq.read_table(corpus / p, columns=["record_id"]).column("record_id").to_pylist()):
            files_of.setdefault(rid, set()).add(p)
    problems["records_in_two_files"] = sorted(r for r, f in files_of.items() if len(f) > 1)[:20]
    return problems


def preprocess(corpus: Path, records: int, shard_records: int, kill_after: int, env: dict, cores: int,
               gcs_address: str) -> dict:
    """(a): build, kill after `kill_after` markers, resume; the checks and the figures."""
    cmd = job("preprocess", "--source", "synthetic", "--output", str(corpus),
              "--set", f"data.synthetic_records={records}", "--set", f"data.shard_records={shard_records}")
    n_shards = math.ceil(records / shard_records)
    markers = str(corpus / STATE_DIR / "shard-*.json")
    log = corpus.parent / "preprocess.log"
    with Monitor(gcs_address) as mon_killed, open(log, "w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        while len(glob.glob(markers)) < kill_after and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            raise SystemExit(f"the job ended (exit {proc.returncode}) before {kill_after} markers existed; see {log}")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_s = time.perf_counter() - t0
    at_kill = snapshot(corpus)
    # Ray kills the dead driver's tasks; one still running would write a marker after the
    # snapshot, and the resumed run must skip (and leave alone) what is on disk when it starts.
    time.sleep(2.0)
    before_resume = snapshot(corpus)
    with Monitor(gcs_address) as mon_resumed:
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
        resumed_s = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"the resumed job failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout[done.stdout.index("{"):])

    src = SyntheticSource(records)
    pre = DataConfig().preprocess
    per_record = int(round(src.duration_s * pre.sampling_rate)) // pre.window_samples
    problems = check_corpus(corpus, n_shards, records * per_record, before_resume)
    if summary["shards_skipped"] != len(before_resume) or summary["shards"] != n_shards:
        problems["shards_skipped"] = [{"skipped": summary["shards_skipped"], "markers_at_kill": len(at_kill),
                                       "markers_at_resume": len(before_resume), "shards": summary["shards"]}]
    # records of the shards the resumed run built ("shard-00012.json" holds shard 12)
    rebuilt = records - sum(min(shard_records, records - int(n[6:11]) * shard_records) for n in before_resume)
    corpus_bytes = sum(p.stat().st_size for p in corpus.rglob("*") if p.is_file())
    return {
        "records": records, "shard_records": shard_records, "shards": n_shards,
        "windows_per_record": per_record,
        "window_bytes": records * per_record * len(pre.leads) * pre.window_samples * np.dtype(SIGNAL_DTYPE).itemsize,
        "corpus_bytes_on_disk": corpus_bytes,
        "killed_after_s": round(killed_s, 1), "markers_at_kill": len(at_kill),
        "markers_after_kill_settled": len(before_resume), "shards_skipped_on_resume": summary["shards_skipped"],
        "resumed_job_s": round(resumed_s, 1), "resumed_pipeline_s": summary["wall_s"],
        "resumed_records_per_s": round(rebuilt / resumed_s, 1),
        "resumed_records_per_s_per_core": round(rebuilt / resumed_s / cores, 1),
        "overall_records_per_s": round(records / (killed_s + resumed_s), 1),
        "overall_records_per_s_per_core": round(records / (killed_s + resumed_s) / cores, 1),
        # Temporary files a killed write left behind (write_atomic's ".<name>.tmp-<pid>").
        "leftover_tmp_files": sorted(str(p.relative_to(corpus)) for p in corpus.rglob(".*tmp-*")),
        "memory_killed_run": mon_killed.figures(), "memory_resumed_run": mon_resumed.figures(),
        "problems": {k: v for k, v in problems.items() if v},
    }


# ---------------------------------------------------------------------------- (b) and (c)


def pretrain_epochs(corpus: Path, run: Path, cache_gb: float, epochs: int, batch_size: int, workers: int,
                    env: dict) -> dict:
    """`jobs/pretrain.py` on the corpus: time to first step and samples/s from its metrics.jsonl."""
    shutil.rmtree(run, ignore_errors=True)     # a finished run folder would only re-export
    run.parent.mkdir(parents=True, exist_ok=True)
    sets = [*TINY, f"optim.epochs={epochs}", f"optim.batch_size={batch_size}", f"train.num_workers={workers}",
            f"data.cache_in_memory_gb={cache_gb}", "train.checkpoint_every_steps=0"]
    cmd = job("pretrain", "--corpus", str(corpus), "--output", str(run), *[a for s in sets for a in ("--set", s)])
    start = time.time()
    with open(run.parent / "pretrain.log", "w") as out:
        rc = subprocess.run(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.time() - start
    if rc != 0:
        raise SystemExit(f"jobs/pretrain.py failed (exit {rc}); see {run.parent / 'pretrain.log'}")
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    event = {r["event"]: r["time"] for r in lines if "event" in r}
    ends = [r for r in lines if r.get("kind") == "epoch"]
    return {"job_s": round(wall, 1), "time_to_first_step_s": round(event["first_step"] - start, 1),
            # the probe at init (rank 0, before the first step) reads every train and val file
            "time_to_probe_init_s": round(event["probe_init"] - start, 1) if "probe_init" in event else None,
            "epoch_samples_per_s": [round(r["samples_per_s"], 1) for r in ends],
            "epoch_s": [round(r["seconds"], 1) for r in ends], "steps": ends[-1]["step"],
            "batch_size": batch_size, "workers": workers}


# ---------------------------------------------------------------------------- main


def _direct_shard(args: tuple[Path, int, int, int]) -> list[dict]:
    """One shard of `direct_corpus`: synthetic records drawn at the stored rate, z-scored, written."""
    from coreecg.data.corpus import windows_table, write_parquet
    from coreecg.data.preprocess import zscore
    from coreecg.data.sources.synthetic import CLASS_NAMES, synthesize_record
    from coreecg.data.splits import assign_split

    corpus, shard, first, n = args
    records = [synthesize_record(0, i, fs=250.0) for i in range(first, first + n)]
    signals = zscore(np.stack([r.signal for r in records]), 1e-6).astype(np.float32)
    rows = [{"dataset": "synthetic", "record_id": r.record_id, "patient_id": r.patient_id, "window_index": 0,
             "split": assign_split("synthetic", r.patient_id, r.record_id),
             "labels": [CLASS_NAMES.index(r.labels[0])]} for r in records]
    table, split = windows_table(rows, signals), np.array([r["split"] for r in rows])
    out = []
    for name in SPLITS:
        idx = np.flatnonzero(split == name)
        if idx.size:
            rel = f"{name}/shard-{shard:05d}.parquet"
            out.append({"path": rel, "split": name, "rows": int(idx.size),
                        "sha256": write_parquet(table.take(idx), corpus / rel)})
    return out


def direct_corpus(corpus: Path, records: int, shard_records: int, cores: int) -> dict:
    """`--direct`: a corpus of `records` synthetic windows written straight from the generator at
    250 Hz (z-scored, the corpus writer's layout and bytes, but no filter or resampling and no
    Ray): a 100k-window corpus in minutes where (a)'s preprocessing takes most of an hour on 2
    shared cores. For (b)-(d); it has no resume markers, so (a) is not run."""
    from multiprocessing import get_context

    from coreecg.data.sources.synthetic import CLASS_NAMES

    t0 = time.perf_counter()
    jobs = [(corpus, i, first, min(shard_records, records - first))
            for i, first in enumerate(range(0, records, shard_records))]
    with get_context("spawn").Pool(cores) as pool:
        shards = [f for part in pool.map(_direct_shard, jobs) for f in part]
    windows = {s: sum(f["rows"] for f in shards if f["split"] == s) for s in SPLITS}
    manifest = {"format": "coreecg-corpus", "format_version": 1, "source": "synthetic",
                "class_names": list(CLASS_NAMES),
                "multilabel": False, "signal": {"shape": [12, 2500], "dtype": "float16", "sampling_rate": 250},
                "counts": {"windows": windows, "windows_total": records}, "shards": shards,
                "note": "bench.large_corpus --direct: generator windows written straight, not preprocessed"}
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    return {"records": records, "write_s": round(time.perf_counter() - t0, 1), "windows": windows}


def leakage(corpus: Path, downstream: Path | None) -> dict:
    """(d) The leakage guard (coreecg.train.leakage_guard) with this corpus as the pretraining corpus:
    its fingerprint pass (what a build adds; an older corpus pays it once, on first use), then the
    guard as a fine-tuning runs it (cached fingerprints: A's train split against the downstream
    corpus's val and test), against `downstream` and against the corpus's own val and test."""
    from coreecg.data.fingerprints import FINGERPRINT_FILE, write_fingerprints
    from coreecg.train.leakage_guard import Pretraining, check_overlap

    t0 = time.perf_counter()
    write_fingerprints(corpus)
    out: dict = {"fingerprint_pass_s": round(time.perf_counter() - t0, 2),
                 "fingerprint_bytes": (corpus / FINGERPRINT_FILE).stat().st_size}
    for name, target in (("downstream", downstream), ("own_val_test", corpus)):
        if target is None:
            continue
        t0 = time.perf_counter()
        entry, _ = check_overlap(Pretraining(str(corpus)), target, allow=True)
        out[name] = {"corpus": str(target), "guard_s": round(time.perf_counter() - t0, 2),
                     **{k: entry[k] for k in ("a_windows", "b_windows_compared", "b_records")}}
    return out


def main() -> int:
    p = parser(__doc__, "512 records in shards of 64, killed after 2 shards; no pretraining epoch")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--workdir", required=True, type=Path, help="holds corpus/, the run folder and the job logs")
    p.add_argument("--shard-records", type=int, default=256)
    p.add_argument("--kill-after-shards", type=int, help="default: a third of the shards")
    p.add_argument("--reuse-corpus", action="store_true", help="skip (a): stream WORKDIR/corpus as it is")
    p.add_argument("--cache-gb", type=float,
                   help="data.cache_in_memory_gb; default half the train split (it must be below it)")
    p.add_argument("--epochs", type=int, default=1, help="pretraining epochs of the tiny model (0: none)")
    p.add_argument("--batch-size", type=int, default=64, help="the pretraining's global batch")
    p.add_argument("--workers", type=int, default=1, help="train.num_workers")
    p.add_argument("--leakage-only", action="store_true", help="after (a), only (d): no ingest pass, no epoch")
    p.add_argument("--direct", action="store_true", help="instead of (a): write the corpus straight from the generator")
    p.add_argument("--downstream", type=Path, help="(d): a downstream corpus to guard against (e.g. PTB-XL)")
    args = p.parse_args()
    if args.quick:
        args.records, args.shard_records, args.kill_after_shards, args.epochs = 512, 64, 2, 0

    import ray

    from coreecg.cluster import init_ray, quiet_data

    workdir = args.workdir.expanduser().resolve()
    corpus = workdir / "corpus"
    if not args.reuse_corpus and corpus.exists():
        raise SystemExit(f"{corpus} exists: remove it, or pass --reuse-corpus to stream it as it is")
    workdir.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    init_ray(args.workers)
    quiet_data()
    gcs = ray.get_runtime_context().gcs_address
    env = job_env({"RAY_ADDRESS": gcs})
    cores = min(cores, int(ray.cluster_resources()["CPU"]))
    result: dict = {"cores": cores, "ray_cpus": int(ray.cluster_resources()["CPU"])}
    if args.direct and not args.reuse_corpus:
        result["direct"] = direct_corpus(corpus, args.records, args.shard_records, cores)
    elif not args.reuse_corpus:
        n_shards = math.ceil(args.records / args.shard_records)
        result["preprocess"] = preprocess(corpus, args.records, args.shard_records,
                                          args.kill_after_shards or max(1, n_shards // 3), env, cores, gcs)

    manifest = load_manifest(corpus)
    shape, dtype = tuple(manifest["signal"]["shape"]), manifest["signal"]["dtype"]
    files = split_files(corpus, "train", manifest)
    train_bytes = manifest["counts"]["windows"]["train"] * int(np.prod(shape)) * np.dtype(dtype).itemsize
    cache_gb = args.cache_gb if args.cache_gb is not None else round(train_bytes / 2**30 / 2, 4)
    cfg = DataConfig()
    result["leakage"] = leakage(corpus, args.downstream)
    if args.leakage_only:
        ray.shutdown()
        emit({"benchmark": "large_corpus", **result})
        return 1 if result.get("preprocess", {}).get("problems") else 0
    passes = []
    for name in ("pyarrow_before", "ingest", "pyarrow_after"):
        with Monitor(gcs) as mon:
            if name == "ingest":
                t0 = time.perf_counter()
                figures = ingest_pass(worker_source(corpus, cache_gb), args.batch_size // args.workers, 0,
                                      cfg.shuffle_buffer, cfg.crop_samples, t0=t0)
            else:
                figures = pyarrow_pass(files, shape, dtype)
        passes.append({**figures, "cpu_us_per_window": round(sum(mon.cpu_s().values()) / figures["windows"] * 1e6),
                       "memory": mon.figures()})
    before, ingest, after = passes
    limit = max(before["windows_per_s"], after["windows_per_s"])
    result["stream"] = {
        "train_windows": manifest["counts"]["windows"]["train"], "train_bytes": train_bytes,
        "cache_in_memory_gb": cache_gb, "ingest": ingest, "pyarrow_before": before, "pyarrow_after": after,
        "ratio_ingest_to_pyarrow": round(ingest["windows_per_s"] / limit, 3),
        "ratio_at_least_0.8": ingest["windows_per_s"] >= 0.8 * limit,
    }
    if args.epochs:
        with Monitor(gcs) as mon_train:
            train = pretrain_epochs(corpus, workdir / "runs" / "large-corpus", cache_gb, args.epochs,
                                    args.batch_size, args.workers, env)
        result["pretrain"] = {**train, "memory": mon_train.figures()}
    ray.shutdown()
    emit({"benchmark": "large_corpus", **result})
    return 1 if result.get("preprocess", {}).get("problems") else 0


if __name__ == "__main__":
    sys.exit(main())
