"""CPSC2018 (ICBEB2018): 9 rhythm/morphology classes, multi-label, 500 Hz, 6-60 s.

Two on-disk forms, detected per folder (a folder with `.hea` files is CinC, otherwise
its `.mat` files are the original release):

(a) original release: `A1980.mat` holding struct `ECG` {sex, age, data (12, N) float},
    labels in `REFERENCE.csv` (Recording, First_label, Second_label, Third_label; 1-9),
    looked up in the record's folder, then its parents up to the root. `data` is already
    in millivolts (QRS peak-to-peak 1-3.5 mV; the CinC 2020 re-release stores the same
    values x1000 as int16 with gain 1000/mV), leads in the standard order I..V6.
(b) PhysioNet/CinC 2020/2021 form: WFDB `.hea` + `.mat`, `#Dx:` with the CPSC
    abbreviations (CinC 2020) or SNOMED-CT codes (CinC 2021), both mapped to the 9 classes.

No patient ids exist in CPSC2018: patient_id is None.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from coreecg.data.record import STANDARD_LEADS, Record, RecordError, RecordRef
from coreecg.data.sources.base import as_age, map_labels, no_records, require_root, split_codes
from coreecg.data.sources.wfdb_io import header_fields, read_wfdb

CLASS_NAMES: tuple[str, ...] = ("Normal", "AF", "I-AVB", "LBBB", "RBBB", "PAC", "PVC", "STD", "STE")
# REFERENCE.csv numbers 1-9 follow CLASS_NAMES.
REFERENCE_CODES: dict[int, str] = {i + 1: name for i, name in enumerate(CLASS_NAMES)}

# SNOMED-CT codes of the CinC re-release. The first code of each class is the one CinC
# used for CPSC (the CPSC column of dx_mapping_*.csv: NSR 918, AF 1221, IAVB 722,
# LBBB 236, RBBB 1857, PAC 616, VEB 700, STD 869, STE 220 = the CPSC2018 class counts);
# the others are the challenge's scored-as-equivalent codes, accepted for robustness.
SNOMED_TO_CLASS: dict[str, str] = {
    "426783006": "Normal",
    "164889003": "AF",
    "270492004": "I-AVB",
    "164909002": "LBBB", "733534002": "LBBB",
    "59118001": "RBBB", "713427006": "RBBB",
    "284470004": "PAC", "63593006": "PAC",
    "164884008": "PVC", "427172004": "PVC", "17338001": "PVC",
    "429622005": "STD",
    "164931005": "STE",
}
_TOKEN_TO_CLASS = {name: name for name in CLASS_NAMES} | SNOMED_TO_CLASS

FS_ORIGINAL = 500.0
# Median per-lead peak-to-peak above this cannot be millivolts (µV data would be ~1000x).
_MAX_MEDIAN_P2P_MV = 50.0


class CPSC2018Source:
    """Reader for both CPSC2018 forms; labels are names from CLASS_NAMES."""

    name = "cpsc2018"
    class_names = CLASS_NAMES
    multilabel = True

    def list_records(self, root: Path) -> list[RecordRef]:
        root = require_root(root)
        refs: list[RecordRef] = []
        for folder in sorted({p.parent for p in root.rglob("*.mat")} | {p.parent for p in root.rglob("*.hea")}):
            heas = sorted(folder.glob("*.hea"))
            if heas:
                refs += [RecordRef(self.name, h.stem, str(h.with_suffix("")), {"form": "cinc"})
                         for h in heas]
                continue
            reference = _reference_rows(folder, root)
            for mat in sorted(folder.glob("*.mat")):
                labels = reference.get(mat.stem)
                refs.append(RecordRef(self.name, mat.stem, str(mat),
                                      {"form": "original", "labels": labels}))
        if not refs:
            raise no_records(self.name, root, "no .hea or .mat files")
        return sorted(refs, key=lambda r: r.path)

    def read(self, ref: RecordRef) -> Record:
        if ref.extra.get("form") == "original":
            return self._read_original(ref)
        return self._read_cinc(ref)

    def _read_original(self, ref: RecordRef) -> Record:
        labels = ref.extra.get("labels")
        if labels is None:
            raise RecordError(ref.path, f"no REFERENCE.csv row: {ref.record_id}")
        data, meta = _load_original_mat(ref.path)
        return Record(self.name, ref.record_id, data, FS_ORIGINAL, STANDARD_LEADS, None,
                      tuple(c for c in CLASS_NAMES if c in labels), ref.path,
                      {"form": "original", **meta})

    def _read_cinc(self, ref: RecordRef) -> Record:
        sig = read_wfdb(ref.path)
        fields = header_fields(sig.comments)
        tokens = split_codes(fields.get("dx", ""))
        if not tokens:
            raise RecordError(ref.path, "no #Dx labels in header")
        unknown_abbr = [t for t in tokens if not t.isdigit() and t not in _TOKEN_TO_CLASS]
        if unknown_abbr:
            raise RecordError(ref.path, f"unknown CPSC label(s) in #Dx: {unknown_abbr}")
        labels, unmapped = map_labels(tokens, _TOKEN_TO_CLASS, CLASS_NAMES)
        meta = {"form": "cinc", "dx": tokens, "unmapped_codes": unmapped,
                "age": as_age(fields.get("age")), "sex": fields.get("sex")}
        return Record(self.name, ref.record_id, sig.signal, sig.fs, sig.lead_names, None,
                      labels, ref.path, meta)


def _reference_rows(folder: Path, root: Path) -> dict[str, list[str]]:
    """Recording -> class names from the nearest REFERENCE.csv at or above `folder`."""
    import pandas as pd

    for d in [folder, *folder.parents]:
        csv = d / "REFERENCE.csv"
        if csv.is_file():
            table = pd.read_csv(csv, dtype=str)
            label_cols = [c for c in table.columns if c.lower().endswith("_label")]
            out = {}
            for _, row in table.iterrows():
                nums = [int(float(row[c])) for c in label_cols if isinstance(row[c], str) and row[c].strip()]
                out[str(row["Recording"]).strip()] = [REFERENCE_CODES[n] for n in nums if n in REFERENCE_CODES]
            return out
        if d == root:
            break
    return {}


def _load_original_mat(path: str) -> tuple[np.ndarray, dict]:
    """Original-release .mat -> ((12, N) float32 mV, {age, sex}) or RecordError."""
    import scipy.io

    try:
        mat = scipy.io.loadmat(path)
    except Exception as exc:
        raise RecordError(path, f"unreadable .mat file: {exc}") from exc
    if "ECG" not in mat:
        raise RecordError(path, f"no struct 'ECG' in .mat (variables: {sorted(k for k in mat if not k.startswith('__'))})")
    ecg = mat["ECG"]
    try:
        data = np.asarray(ecg["data"][0, 0], dtype=np.float32)
        age = ecg["age"][0, 0].ravel()
        sex = ecg["sex"][0, 0].ravel()
    except (ValueError, IndexError, TypeError) as exc:
        raise RecordError(path, f"struct ECG lacks data/age/sex fields: {exc}") from exc
    if data.ndim != 2 or data.shape[0] != 12:
        raise RecordError(path, f"ECG.data has shape {data.shape}, expected (12, samples)")
    p2p = np.nanmedian(np.nanmax(data, axis=1) - np.nanmin(data, axis=1))
    if p2p > _MAX_MEDIAN_P2P_MV:
        raise RecordError(path, f"not millivolts: median lead peak-to-peak {p2p:.0f} (microvolts?)")
    meta = {"age": as_age(age[0]) if age.size else None,
            "sex": str(sex[0]) if sex.size else None}
    return data, meta
