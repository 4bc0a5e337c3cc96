"""Corpus overlap, what the leakage guard checks: which records of one corpus (B, downstream)
share a patient or a recording with another (A, pretraining), docs/leakage.md.

    patient   the same (dataset, patient id) on both sides: records of one patient within one
              database (a record without a patient id is its own patient, `record:<id>`)
    signal    a window of B whose fingerprint (coreecg.data.fingerprints) matches one of A: the
              same recording under another name, format, gain, sampling rate or lead order

Signal matching: candidates share at least one lead's key (any lead with any lead: order-free);
a candidate is a copy when its features agree, lead by lead in the stored (canonical, by name)
order, with mean cosine >= SIMILARITY, or, leads matched to their best partner, >= PERMUTED
(a copy whose lead names were swapped). Both thresholds are measured on the shared data
(docs/leakage.md): copies of PTB-XL at another sampling rate score 0.85-1.0, different records
at most 0.88 lead by lead and 0.96 lead-permuted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from coreecg.data.fingerprints import META_COLUMNS, decode_fingerprints, patient_ids_warning, preprocess_warning
from coreecg.data.splits import SPLITS

SIMILARITY = 0.9
PERMUTED = 0.98
GUARDED_SPLITS = ("val", "test")       # what a fine-tuning's numbers are measured on
PRETRAINED_SPLITS = ("train",)         # what pretraining trains on (its val split only monitors)
OVERLAP_CSV = "overlap.csv"
CSV_FIELDS = ("a_dataset", "a_record", "a_patient", "a_split", "b_dataset", "b_record", "b_patient", "b_split",
              "kind", "similarity", "windows")
EXAMPLES = 10                          # records an error message names
_CHUNK = 200_000                       # candidate pairs verified at once (bounded memory)


class LeakageError(ValueError):
    """A pretraining corpus shares records or patients with a downstream val/test split, or the
    pretraining corpus cannot be checked (named, before any training)."""


@dataclass
class Overlap:
    """The record pairs two corpora share, and their counts (`counts`)."""

    a: str
    b: str
    pairs: pd.DataFrame                          # CSV_FIELDS, one row per (A record, B record, kind)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def b_record_ids(self) -> list[str]:
        """The records of B that share anything with A, sorted."""
        return sorted(set(self.pairs["b_record"]))

    def write_csv(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.pairs.to_csv(path, index=False, columns=list(CSV_FIELDS))
        return path

    def message(self) -> str:
        """The error's account: counts and up to EXAMPLES records of B with their match in A."""
        c = self.counts
        first = self.pairs.drop_duplicates("b_record").head(EXAMPLES)
        named = ", ".join(f"{r.b_record} ({r.b_split}; {r.kind} of {r.a_record})" for r in first.itertuples())
        more = f" and {c['b_records'] - len(first)} more" if c["b_records"] > len(first) else ""
        return (f"{c['b_records']} record(s) of {self.b} share a patient ({c['patient_records']}) or a recording "
                f"({c['signal_records']}) with the pretraining corpus {self.a}: {named}{more}")


def records_of(table: pa.Table) -> pd.DataFrame:
    """One row per record: dataset, record_id, patient_id, split (a fingerprint table's metadata)."""
    return table.select(list(META_COLUMNS)).to_pandas().drop(columns="window_index").drop_duplicates(
        ["dataset", "record_id"])


def patient_pairs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Records of A and B with the same (dataset, patient id)."""
    m = a.merge(b, on=["dataset", "patient_id"], suffixes=("_a", "_b"))
    return pd.DataFrame({"a_dataset": m["dataset"], "a_record": m["record_id_a"], "a_patient": m["patient_id"],
                         "a_split": m["split_a"], "b_dataset": m["dataset"], "b_record": m["record_id_b"],
                         "b_patient": m["patient_id"], "b_split": m["split_b"], "kind": "patient",
                         "similarity": np.nan, "windows": 0})


def candidate_pairs(keys_a: np.ndarray, keys_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(window of A, window of B) pairs that share at least one non-zero lead key, each once."""
    leads_a, leads_b = keys_a.shape[1], keys_b.shape[1]
    flat_a, flat_b = keys_a.ravel(), keys_b.ravel()
    order = np.argsort(flat_a, kind="stable")
    sorted_a = flat_a[order]
    lo, hi = np.searchsorted(sorted_a, flat_b, "left"), np.searchsorted(sorted_a, flat_b, "right")
    hits = np.where(flat_b == 0, 0, hi - lo)               # 0: a flat lead, no key
    rows_b = np.repeat(np.arange(flat_b.size), hits)
    start = np.repeat(lo - (np.cumsum(hits) - hits), hits)
    rows_a = order[start + np.arange(rows_b.size)]
    pair = np.unique((rows_a // leads_a).astype(np.int64) * len(keys_b) + rows_b // leads_b)
    return pair // len(keys_b), pair % len(keys_b)


def similarity(fa: np.ndarray, fb: np.ndarray, norm_a: np.ndarray, norm_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, leads, blocks) int8 feature pairs and their (n, leads) norms -> (lead-by-lead mean
    cosine, lead-permuted mean cosine: each lead of B with its best lead of A); flat leads (norm 0)
    are left out of the means. One batched matmul gives every lead pair's dot product."""
    dots = np.matmul(fb.astype(np.float32), fa.astype(np.float32).transpose(0, 2, 1))    # (n, B lead, A lead)
    cos = dots / np.maximum(norm_b[:, :, None] * norm_a[:, None, :], 1e-6)
    if cos.shape[1] != cos.shape[2]:       # corpora storing other lead sets: no lead-by-lead order
        return np.zeros(len(cos), np.float32), _masked_mean(cos.max(-1), norm_b > 0)
    same = _masked_mean(np.diagonal(cos, axis1=1, axis2=2), (norm_a > 0) & (norm_b > 0))
    return same, _masked_mean(cos.max(-1), norm_b > 0)


def _masked_mean(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, x, 0).sum(-1) / np.maximum(mask.sum(-1), 1)


def _norms(features: np.ndarray) -> np.ndarray:
    return np.linalg.norm(features.astype(np.float32), axis=-1)


def signal_windows(a: pa.Table, b: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Matching windows: (rows of A, rows of B, similarity), verified in chunks of candidates."""
    keys_a, feats_a = decode_fingerprints(a)
    keys_b, feats_b = decode_fingerprints(b)
    wa, wb = candidate_pairs(keys_a, keys_b)
    norm_a, norm_b = _norms(feats_a), _norms(feats_b)
    out_a, out_b, out_s = [], [], []
    for i in range(0, len(wa), _CHUNK):
        ca, cb = wa[i:i + _CHUNK], wb[i:i + _CHUNK]
        same, permuted = similarity(feats_a[ca], feats_b[cb], norm_a[ca], norm_b[cb])
        hit = (same >= SIMILARITY) | (permuted >= PERMUTED)
        out_a.append(ca[hit])
        out_b.append(cb[hit])
        out_s.append(np.maximum(same, permuted)[hit])
    if not out_a:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    return np.concatenate(out_a), np.concatenate(out_b), np.concatenate(out_s)


def signal_pairs(a: pa.Table, b: pa.Table) -> pd.DataFrame:
    """Record pairs of A and B with matching windows: the best similarity, the windows matched."""
    wa, wb, sim = signal_windows(a, b)
    meta_a = a.select(list(META_COLUMNS)).take(pa.array(wa)).to_pandas()
    meta_b = b.select(list(META_COLUMNS)).take(pa.array(wb)).to_pandas()
    df = pd.DataFrame({"a_dataset": meta_a["dataset"], "a_record": meta_a["record_id"],
                       "a_patient": meta_a["patient_id"], "a_split": meta_a["split"],
                       "b_dataset": meta_b["dataset"], "b_record": meta_b["record_id"],
                       "b_patient": meta_b["patient_id"], "b_split": meta_b["split"], "kind": "signal",
                       "similarity": sim.round(4), "windows": 1})
    keys = [c for c in CSV_FIELDS if c not in ("similarity", "windows")]
    return df.groupby(keys, as_index=False).agg(similarity=("similarity", "max"), windows=("windows", "sum"))


def only_splits(table: pa.Table, splits: Iterable[str] | None) -> pa.Table:
    """The rows of `splits` (None: all)."""
    if splits is None:
        return table
    return table.filter(pc.is_in(table.column("split"), pa.array(list(splits), pa.string())))


def compare(a: pa.Table, b: pa.Table, a_name: str, b_name: str, splits: Iterable[str] | None = None,
            a_splits: Iterable[str] | None = None) -> Overlap:
    """A's fingerprints (`a_splits`, default all) against B's (`splits`, default all): an Overlap."""
    a, b = only_splits(a, a_splits), only_splits(b, splits)
    pairs = pd.concat([patient_pairs(records_of(a), records_of(b)), signal_pairs(a, b)], ignore_index=True)
    pairs = pairs.sort_values(["b_split", "b_record", "kind", "a_record"], ignore_index=True)
    counts = overlap_counts(a, b, pairs)
    warnings = [w for w in (preprocess_warning(a, b), patient_ids_warning(a, b)) if w]
    if warnings:
        counts["warning"] = "; ".join(warnings)
    return Overlap(a_name, b_name, pairs, counts)


def overlap_counts(a: pa.Table, b: pa.Table, pairs: pd.DataFrame) -> dict[str, Any]:
    """Records on each side, and B's records sharing a patient / a recording, in all and per split."""
    rec_b = records_of(b)
    by_split = {}
    for split in sorted(set(rec_b["split"]), key=lambda s: (s not in SPLITS, SPLITS.index(s) if s in SPLITS else s)):
        part, shared = rec_b[rec_b["split"] == split], pairs[pairs["b_split"] == split]
        by_split[str(split)] = {"records": int(len(part)), "shared": int(shared["b_record"].nunique()),
                                "patient": int(shared.loc[shared["kind"] == "patient", "b_record"].nunique()),
                                "signal": int(shared.loc[shared["kind"] == "signal", "b_record"].nunique())}
    patients = pairs.loc[pairs["kind"] == "patient", ["b_dataset", "b_patient"]].drop_duplicates()
    return {"a_records": int(len(records_of(a))), "a_windows": int(a.num_rows),
            "b_records": int(pairs["b_record"].nunique()), "b_records_compared": int(len(rec_b)),
            "b_windows_compared": int(b.num_rows), "shared_patients": int(len(patients)),
            "patient_records": int(pairs.loc[pairs["kind"] == "patient", "b_record"].nunique()),
            "signal_records": int(pairs.loc[pairs["kind"] == "signal", "b_record"].nunique()),
            "by_split": by_split}
