"""Which storage layout for the corpus's signal column (docs/data_pipeline.md, "Storage layout").

    python -m experiments.storage_layout                 # 1024 synthetic windows, prints JSON
    python -m experiments.storage_layout --windows 2048

Writes the same z-scored windows in each candidate layout (signal dtype float32/float16,
fixed_size_list column vs binary blob, compression none/zstd, row-group size), no Ray, and
reports file size, write time, read + decode-to-float32 windows/s and the reconstruction error.
The training path's read speed on the chosen layout: `python -m bench.ingest`.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import dump
from coreecg.config import PreprocessConfig
from coreecg.data import synthetic_windows
from coreecg.data.corpus import decode_signals


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
    candidates = [(d, lay, c, 128)
                  for d in ("float32", "float16") for lay in ("list", "binary") for c in ("none", "zstd")]
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        x, _ = synthetic_windows(args.windows, seed=0, cfg=PreprocessConfig())
        result = {"windows": args.windows, "layouts": bench_layouts(x, tmp, args.repeats)}
    print(dump(result))


if __name__ == "__main__":
    main()
