"""The output files of an inference (each written whole: coreecg.files): predictions.csv as the
fine-tuning run writes it, embeddings.parquet, failed.csv as a corpus's quarantine.csv."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence
import csv

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from coreecg.files import write_atomic
from coreecg.inference.items import Failure, InferenceError, InferenceResult

PREDICTIONS_FILE = "predictions.csv"
EMBEDDINGS_FILE = "embeddings.parquet"
FAILED_FILE = "failed.csv"


def write_predictions_csv(path: str | Path, result: InferenceResult) -> Path:
    """record_id, path, then p_<class> per class, formatted as the fine-tuning run's
    predictions.csv writes them (`coreecg.eval.downstream.write_predictions`); a regression task's
    model: pred_<task>, its value in the target's unit."""
    if result.probs is None:
        raise InferenceError("no class probabilities to write (the model is an encoder)")

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            prefix = "pred_" if result.regression else "p_"
            w.writerow(["record_id", "path", *(f"{prefix}{c}" for c in result.class_names)])
            for rid, rpath, p in zip(result.record_id, result.path, result.probs):
                w.writerow([rid, rpath, *(f"{v:.8g}" for v in p)])

    return write_atomic(path, write)


def write_embeddings_parquet(path: str | Path, result: InferenceResult, metadata: dict[str, str] | None = None
                             ) -> Path:
    """record_id, path, embedding (fixed_size_list<float32>[D]) per record; `metadata` in the schema."""
    if result.embeddings is None:
        raise InferenceError("no embeddings to write")
    emb = np.ascontiguousarray(result.embeddings, dtype=np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
    table = pa.table({"record_id": pa.array(result.record_id, pa.string()),
                      "path": pa.array(result.path, pa.string()), "embedding": column})
    if metadata:
        table = table.replace_schema_metadata({k: str(v) for k, v in metadata.items()})
    return write_atomic(path, lambda tmp: pq.write_table(table, str(tmp)))


def write_failures_csv(path: str | Path, failures: Sequence[Failure]) -> Path:
    """record_id, path, reason: the columns of a corpus's quarantine.csv."""
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["record_id", "path", "reason"])
            w.writerows([x.record_id, x.path, x.reason] for x in failures)

    return write_atomic(path, write)

