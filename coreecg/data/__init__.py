"""ECG data: readers (`sources`), the paper's preprocessing, patient-level splits and the
Parquet corpus on Ray Data. Data never imports the model or training code.

    windows, labels = synthetic_windows(256, seed=0, cfg=PreprocessConfig())   # no Ray, no files
    arrays = read_split("corpora/ptbxl", split="val")                          # dict of numpy
"""
from __future__ import annotations

import importlib

import numpy as np

from coreecg.config import PreprocessConfig

# Lazy imports: the package's names load on first use (PEP 562), and synthetic_windows imports the
# preprocessing and the synthetic source when called: a Ray Data worker that reads shard files
# imports `coreecg.data.corpus` without scipy, wfdb and the sources (1.7 s less per fresh worker).
_NAMES = {
    "ALL_COLUMNS": "coreecg.data.corpus",
    "CorpusError": "coreecg.data.corpus", "load_manifest": "coreecg.data.corpus",
    "split_files": "coreecg.data.corpus",
    "verify_corpus": "coreecg.data.corpus",
    "build_corpus": "coreecg.data.pipeline",
    "build_corpus_from_arrays": "coreecg.data.from_arrays",
    "preprocess_record": "coreecg.data.preprocess",
    "read_split": "coreecg.data.reading",
    "STANDARD_LEADS": "coreecg.data.record", "Record": "coreecg.data.record",
    "RecordError": "coreecg.data.record", "RecordRef": "coreecg.data.record",
    "SPLITS": "coreecg.data.splits", "assign_split": "coreecg.data.splits",
}


def __getattr__(name: str):
    if name == "SYNTHETIC_CLASS_NAMES":
        return importlib.import_module("coreecg.data.sources.synthetic").CLASS_NAMES
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'coreecg.data' has no attribute {name!r}")


def synthetic_windows(n: int, seed: int, cfg: PreprocessConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """n preprocessed synthetic windows, in memory, exactly as the corpus would store them
    (before its float16 cast): (n, len(cfg.leads), cfg.window_samples) float32 and labels (n,)
    int64 indexing SYNTHETIC_CLASS_NAMES. Records are 10 s, so record i gives window i.
    """
    from coreecg.data.preprocess import preprocess_record
    from coreecg.data.sources.synthetic import CLASS_NAMES, synthesize_record

    cfg = cfg or PreprocessConfig()
    out = np.empty((n, len(cfg.leads), cfg.window_samples), dtype=np.float32)
    labels = np.empty(n, dtype=np.int64)
    for i in range(n):
        record = synthesize_record(seed, i, duration_s=cfg.window_s)
        out[i] = preprocess_record(record, cfg)[0]
        labels[i] = CLASS_NAMES.index(record.labels[0])
    return out, labels


__all__ = [
    "ALL_COLUMNS", "CorpusError", "PreprocessConfig", "build_corpus", "build_corpus_from_arrays", "Record",
    "RecordError", "RecordRef", "SPLITS", "STANDARD_LEADS",
    "SYNTHETIC_CLASS_NAMES", "assign_split", "load_manifest", "preprocess_record",
    "read_split", "split_files", "synthetic_windows", "verify_corpus",
]
