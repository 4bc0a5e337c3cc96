"""Preprocessing throughput: records/s on one core, with the share of time per stage.

    python -m bench.preprocess                                   # real PTB-XL 500 Hz records
    python -m bench.preprocess --source synthetic --records 200
    python -m bench.preprocess --source code15 --input DIR      # DIR: python -m bench.code15_layout
    python -m bench.preprocess --pipeline                        # also the Ray Data job, all CPUs
    python -m bench.preprocess --quick                           # 20 records: a smoke run

Stages, timed on one core in this process: read (the source reader), filter (band-pass at
the native rate), resample (to 250 Hz), rest of preprocess_record (lead checks, windows,
z-score), write (Arrow table + Parquet shard + sha256). `--pipeline` then runs
`build_corpus` over the same refs (Ray Data, one task per shard, all CPUs) and reports its
wall-clock records/s.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import SHARED, emit, machine, parser
from coreecg.config import DataConfig, PreprocessConfig
from coreecg.data.corpus import windows_table, write_parquet
from coreecg.data.leads import select_leads
from coreecg.data.preprocess import bandpass, preprocess_record, resample, resample_factors
from coreecg.data.record import RecordError
from coreecg.data.sources import get_source


def main() -> None:
    p = parser(__doc__, "20 records, one core (with --pipeline, the Ray Data job on them too)")
    p.add_argument("--source", default="ptbxl")
    p.add_argument("--input", default=str(SHARED / "ptbxl"))
    p.add_argument("--records", type=int, default=200)
    p.add_argument("--pipeline", action="store_true", help="also time build_corpus with Ray Data")
    args = p.parse_args()
    if args.quick:
        args.records = 20

    options = {"label_view": "none"} if args.source == "ptbxl" else {}
    if args.source == "synthetic":
        options = {"n_records": args.records}
    src = get_source(args.source, **options)
    refs = src.list_records(Path(args.input) if args.source != "synthetic" else None)
    cfg = PreprocessConfig()
    t = dict.fromkeys(("read", "filter", "resample", "preprocess_total", "write"), 0.0)
    done, failed, windows, rows, signals = 0, 0, 0, [], []
    for ref in refs:
        if done >= args.records:
            break
        t0 = time.perf_counter()
        try:
            rec = src.read(ref)
        except RecordError:
            failed += 1  # PTB-XL's csv lists records not in the subset; not counted
            continue
        t1 = time.perf_counter()
        w = preprocess_record(rec, cfg)
        t2 = time.perf_counter()
        # The two numeric stages again, separately, to split preprocess_total.
        sig, _ = select_leads(rec.signal, rec.lead_names, cfg.leads, cfg.extra_leads, rec.path)
        filtered = bandpass(sig, rec.fs, cfg)
        t3 = time.perf_counter()
        resample(filtered, *resample_factors(rec.fs, cfg.sampling_rate, cfg.resample_max_denominator))
        t4 = time.perf_counter()
        t["read"] += t1 - t0
        t["preprocess_total"] += t2 - t1
        t["filter"] += t3 - t2
        t["resample"] += t4 - t3
        done += 1
        windows += len(w)
        signals.append(w)
        rows += [{"dataset": rec.source, "record_id": rec.record_id, "patient_id": "p", "window_index": i,
                  "split": "train", "labels": []} for i in range(len(w))]
    all_windows = np.concatenate(signals)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        for i in range(0, len(rows), 128):  # shards as the pipeline writes them
            write_parquet(windows_table(rows[i:i + 128], all_windows[i:i + 128]),
                          Path(d) / f"shard-{i}.parquet")
        t["write"] = time.perf_counter() - t0
    total = t["read"] + t["preprocess_total"] + t["write"]
    result = {
        "benchmark": "preprocess", **machine(), "source": args.source, "records": done, "windows": windows,
        "unreadable_skipped": failed,
        "records_per_s_per_core": round(done / total, 1),
        "ms_per_record": {k: round(1e3 * v / done, 2) for k, v in t.items()},
        "share": {"read": round(t["read"] / total, 3),
                  "filter": round(t["filter"] / total, 3),
                  "resample": round(t["resample"] / total, 3),
                  "other_preprocess": round((t["preprocess_total"] - t["filter"] - t["resample"]) / total, 3),
                  "write": round(t["write"] / total, 3)},
    }
    if args.pipeline:
        import ray

        from coreecg.cluster import init_ray, quiet_data
        from coreecg.data.pipeline import build_corpus

        init_ray()
        quiet_data()
        with tempfile.TemporaryDirectory() as d:
            sub = refs[: done + failed]
            out = build_corpus(args.source, args.input, Path(d) / "c", DataConfig(shard_records=32),
                               source_options=options, refs=sub)
        ray.shutdown()
        result["pipeline"] = {"records_listed": len(sub),
                              "records_written": out["counts"]["records_written"],
                              "wall_s": round(out["run"]["wall_s"], 2),
                              "records_per_s": round(out["counts"]["records_written"] / out["run"]["wall_s"], 1)}
    emit(result)


if __name__ == "__main__":
    main()
