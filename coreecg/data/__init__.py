"""ECG data: readers (`sources`), the paper's preprocessing, patient-level splits and the
Parquet corpus on Ray Data. Data never imports the model or training code.

    windows, labels = synthetic_windows(256, seed=0, cfg=PreprocessConfig())   # no Ray, no files
    ds = open_corpus("corpora/ptbxl", split="train")                           # ray.data.Dataset
    arrays = read_split("corpora/ptbxl", split="val")                          # dict of numpy
"""
from __future__ import annotations

import numpy as np

from coreecg.config import PreprocessConfig
from coreecg.data.corpus import (
    ALL_COLUMNS, TRAINING_COLUMNS, CorpusError, load_manifest, open_corpus, split_files, verify_corpus,
)
from coreecg.data.pipeline import build_corpus
from coreecg.data.preprocess import preprocess_record
from coreecg.data.reading import read_split
from coreecg.data.record import STANDARD_LEADS, Record, RecordError, RecordRef
from coreecg.data.sources.synthetic import CLASS_NAMES as SYNTHETIC_CLASS_NAMES
from coreecg.data.sources.synthetic import synthesize_record
from coreecg.data.splits import SPLITS, assign_split


def synthetic_windows(n: int, seed: int, cfg: PreprocessConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """n preprocessed synthetic windows, in memory, exactly as the corpus would store them
    (before its float16 cast): (n, len(cfg.leads), cfg.window_samples) float32 and labels (n,)
    int64 indexing SYNTHETIC_CLASS_NAMES. Records are 10 s, so record i gives window i.
    """
    cfg = cfg or PreprocessConfig()
    out = np.empty((n, len(cfg.leads), cfg.window_samples), dtype=np.float32)
    labels = np.empty(n, dtype=np.int64)
    for i in range(n):
        record = synthesize_record(seed, i, duration_s=cfg.window_s)
        out[i] = preprocess_record(record, cfg)[0]
        labels[i] = SYNTHETIC_CLASS_NAMES.index(record.labels[0])
    return out, labels


__all__ = [
    "ALL_COLUMNS", "TRAINING_COLUMNS", "CorpusError", "PreprocessConfig", "build_corpus", "Record", "RecordError", "RecordRef", "SPLITS", "STANDARD_LEADS",
    "SYNTHETIC_CLASS_NAMES", "assign_split", "load_manifest", "open_corpus", "preprocess_record",
    "read_split", "split_files", "synthetic_windows", "verify_corpus",
]
