"""Corpus read speed: storage layouts compared, then Ray Data -> torch batches vs plain pyarrow.

    python bench/ingest.py                       # 1024 synthetic windows, prints JSON
    python bench/ingest.py --windows 2048 --batch-size 256 --epochs 3

Part 1 (no Ray) writes the same z-scored windows in each candidate layout (signal dtype
float32/float16, fixed_size_list column vs binary blob, compression none/zstd, row-group
size) and reports file size, write time, read + decode-to-float32 windows/s and the
reconstruction error. Part 2 builds a real corpus with the pipeline (the chosen layout) and
reads its train split (a) with pyarrow alone (the limit) and (b) through
`open_corpus(...).iter_torch_batches` (what training does), in windows/s.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from coreecg.config import DataConfig, PreprocessConfig
from coreecg.data import open_corpus, synthetic_windows
from coreecg.data.corpus import decode_batch, decode_signals, load_manifest, split_files


def write_layout(x: np.ndarray, path: Path, dtype: str, layout: str, compression: str, rg: int) -> float:
    n_values = x[0].size
    flat = np.ascontiguousarray(x, dtype=dtype).reshape(len(x), n_values)
    if layout == "list":
        col = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), n_values)
    else:
        col = pa.array([row.tobytes() for row in flat], type=pa.binary(flat.itemsize * n_values))
    table = pa.table({"record_id": pa.array([f"r{i}" for i in range(len(x))]), "signal": col})
    t0 = time.perf_counter()
    # As the corpus writer does: dictionary encoding only for string columns, never the signal.
    pq.write_table(table, path, compression=compression, row_group_size=rg, use_dictionary=["record_id"])
    return time.perf_counter() - t0


def read_layout(path: Path, dtype: str, layout: str, shape: tuple[int, ...]) -> np.ndarray:
    col = pq.read_table(path, columns=["signal"]).column("signal").combine_chunks()
    if layout == "list":
        return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, *shape).astype(np.float32)
    return decode_signals(col, shape, dtype)


def bench_layouts(x: np.ndarray, tmp: Path, repeats: int) -> list[dict]:
    rows = []
    candidates = [(d, l, c, 128) for d in ("float32", "float16") for l in ("list", "binary") for c in ("none", "zstd")]
    candidates += [("float16", "binary", "none", rg) for rg in (16, 512)]
    for dtype, layout, comp, rg in candidates:
        path = tmp / f"{dtype}-{layout}-{comp}-{rg}.parquet"
        write_s = write_layout(x, path, dtype, layout, comp, rg)
        os.sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            y = read_layout(path, dtype, layout, x.shape[1:])
            times.append(time.perf_counter() - t0)
        err = np.abs(y - x)
        rows.append({"dtype": dtype, "layout": layout, "compression": comp, "row_group_rows": rg,
                     "bytes_per_window": round(path.stat().st_size / len(x)),
                     "write_windows_per_s": round(len(x) / write_s),
                     "read_windows_per_s": round(len(x) / min(times)),
                     "max_abs_err": float(err.max()), "rms_err": float(np.sqrt((err ** 2).mean())),
                     "max_abs_value": float(np.abs(x).max())})
    return rows


def bench_ray(n: int, tmp: Path, batch_size: int, epochs: int) -> dict:
    import ray
    import ray.data

    from coreecg.data.pipeline import build_corpus

    if not ray.is_initialized():
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    out = tmp / "corpus"
    t0 = time.perf_counter()
    build_corpus("synthetic", None, out, DataConfig(shard_records=128), source_options={"n_records": n, "seed": 0})
    build_s = time.perf_counter() - t0
    files = split_files(out, "train")
    manifest = load_manifest(out)
    kwargs = {"shape": (12, 2500), "n_classes": len(manifest["class_names"]), "dtype": manifest["signal"]["dtype"]}
    n_train = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    t0 = time.perf_counter()
    for f in files:
        decode_signals(pq.read_table(f, columns=["signal"]).column("signal"), (12, 2500), kwargs["dtype"])
    pyarrow_wps = n_train / (time.perf_counter() - t0)

    def epochs_of(make_ds) -> list[int]:
        per_epoch = []
        for _ in range(epochs):
            t0 = time.perf_counter()
            seen = 0
            for batch in make_ds().iter_torch_batches(batch_size=batch_size):
                seen += len(batch["label"])
            assert seen == n_train
            per_epoch.append(round(seen / (time.perf_counter() - t0)))
        return per_epoch

    ours = epochs_of(lambda: open_corpus(out, "train"))
    # The alternative open_corpus does not use: Ray's own Parquet datasource, same decode.
    theirs = epochs_of(lambda: ray.data.read_parquet([str(f) for f in files]).select_columns(["labels", "signal"])
                       .map_batches(decode_batch, batch_format="pyarrow", fn_kwargs=kwargs))
    return {"train_windows": n_train, "build_corpus_s": round(build_s, 2),
            "pyarrow_windows_per_s": round(pyarrow_wps),
            "open_corpus_torch_windows_per_s_per_epoch": ours,
            "read_parquet_torch_windows_per_s_per_epoch": theirs,
            "batch_size": batch_size, "cpus": os.cpu_count()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-ray", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        x, _ = synthetic_windows(args.windows, seed=0, cfg=PreprocessConfig())
        result = {"windows": args.windows, "layouts": bench_layouts(x, tmp, args.repeats)}
        del x
        if not args.skip_ray:
            result["ray"] = bench_ray(args.windows, tmp, args.batch_size, args.epochs)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
