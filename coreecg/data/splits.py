"""Patient-level train/val/test assignment that never moves a patient.

A patient's split is a pure function of (dataset, patient key): sha256 of the pair, read as a
number uniform in [0, 1), compared with the cumulative ratios. Adding records or whole patients
never changes an existing patient's split, every record of a patient lands in the same split,
and no state has to be stored.

A source may fix a record's split instead (PTB-XL's `split=folds`: its strat_fold, the
benchmark's split, which also keeps each patient in one fold): the record's meta["split"],
which `record_split` prefers to the hash. The corpus's manifest names the rule (`split_rule`).

Records without a patient id (CPSC2018/ICBEB2018 publishes none) fall back to the record id:
each record is its own patient. That is the best available and is what CPSC2018 uses here.
"""
from __future__ import annotations

import hashlib

from coreecg.data.record import RecordError

SPLITS: tuple[str, ...] = ("train", "val", "test")
# PTB-XL's recommended split (Strodthoff et al.): strat_fold 1-8 train, 9 val, 10 test.
FOLD_SPLITS: dict[int, str] = {**{f: "train" for f in range(1, 9)}, 9: "val", 10: "test"}


def patient_key(patient_id: str | None, record_id: str) -> str:
    """The grouping key of a record: its patient id, or 'record:<record_id>' when it has none."""
    if patient_id is None or str(patient_id).strip() == "":
        return f"record:{record_id}"
    return str(patient_id).strip()


def unit_hash(dataset: str, key: str) -> float:
    """sha256(dataset, key) as a float uniform in [0, 1); stable across runs and machines."""
    digest = hashlib.sha256(f"{dataset}\x1f{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(dataset: str, patient_id: str | None, record_id: str,
                 ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> str:
    """'train' | 'val' | 'test' for a record, decided by its patient (see module docstring)."""
    u = unit_hash(dataset, patient_key(patient_id, record_id))
    edge = 0.0
    for name, ratio in zip(SPLITS, ratios):
        edge += ratio
        if u < edge:
            return name
    return SPLITS[-1]  # u within float rounding of 1.0 when the ratios sum to 1 - 1e-16


def fold_split(fold: int, path: str) -> str:
    """The split of a PTB-XL strat_fold (FOLD_SPLITS); RecordError naming `path` for any other fold."""
    if fold not in FOLD_SPLITS:
        raise RecordError(path, f"strat_fold {fold} is not 1-10: no fold split")
    return FOLD_SPLITS[fold]


def record_split(record, ratios: tuple[float, float, float]) -> str:
    """The split a record is stored under: the one its source fixed (meta["split"]), else its patient's."""
    fixed = record.meta.get("split")
    if fixed is not None:
        if fixed not in SPLITS:
            raise ValueError(f"{record.path}: the source fixed split {fixed!r}, not one of {SPLITS}")
        return fixed
    return assign_split(record.source, record.patient_id, record.record_id, ratios)
