"""CPSC2018 (ICBEB2018): 9 rhythm/morphology classes, 500 Hz, 6-60 s, 1-3 labels a record.

Two on-disk forms, detected per folder (a folder with `.hea` files is CinC, otherwise
its `.mat` files are the original release):

(a) original release: `A1980.mat` holding struct `ECG` {sex, age, data (12, N) float},
    labels in `REFERENCE.csv` (Recording, First_label, Second_label, Third_label; 1-9),
    looked up in the record's folder, then its parents up to the root. `data` is already
    in millivolts (QRS peak-to-peak 1-3.5 mV; the CinC 2020 re-release stores the same
    values x1000 as int16 with gain 1000/mV), leads in the standard order I..V6.
(b) PhysioNet/CinC 2020/2021 form: WFDB `.hea` + `.mat`, `#Dx:` with the CPSC
    abbreviations (CinC 2020) or SNOMED-CT codes (CinC 2021), both mapped to the 9 classes.
    A `.mat` (or `.dat`) without its header is listed and read as "no header".

Labels keep the source's order, primary first: REFERENCE.csv's First, Second, Third_label,
or the `#Dx` order of the CinC form (which has no First_label column; its order is taken as
the primary-first order of REFERENCE.csv). `label_view`:
- "first" (default; the paper's 9-class single-label task, as the challenge scored it):
  the first label only.
- "single": only records with exactly one label; others raise "not single-label".
- "multi": every label, primary first.
- "none": no labels (pretraining); no class names.
In a view with labels, a record with none of the 9 classes (CPSC-Extra's SNOMED codes, a
REFERENCE row with numbers outside 1-9) raises "no label of the task"; the codes go to
`meta["unrecognised_codes"]` / `RecordError.unrecognised_codes` for the manifest's counts.

No patient ids exist in CPSC2018: patient_id is None unless a header comment names one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from coreecg.data.record import STANDARD_LEADS, Record, RecordError, RecordRef
from coreecg.data.sources.base import (
    DATA_SUFFIXES, as_age, no_header_ref, no_records, orphan_data_files, raise_listing_error, require_root,
    require_task_label, split_codes, walk,
)
from coreecg.data.sources.registry import IndexFile, register_source
from coreecg.data.sources.wfdb_io import header_fields, patient_from_comments, read_wfdb

# Lazy imports: scipy.io, where a .mat record is read (0.7 s; python -X importtime).

CLASS_NAMES: tuple[str, ...] = ("Normal", "AF", "I-AVB", "LBBB", "RBBB", "PAC", "PVC", "STD", "STE")
LABEL_VIEWS = ("first", "single", "multi", "none")
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


@dataclass
class CPSC2018Options:
    """The config section data.sources.cpsc2018."""

    # first: REFERENCE.csv's First_label, the challenge's primary label (the paper's 9-class
    # single-label task); single: records with one label only; multi: all labels; none: unlabelled
    label_view: Literal["first", "single", "multi", "none"] = "first"


# The paper calls the dataset ICBEB2018: runs of a cpsc2018 corpus are filed under icbeb2018.
@register_source("cpsc2018", options=CPSC2018Options, label_free={"label_view": "none"},
                 index_file=IndexFile("REFERENCE.csv", ("First_label",), "its labels would be lost"),
                 dataset_label={"icbeb2018": "ICBEB2018"}, dataset_aliases={"cpsc2018": "icbeb2018"})
class CPSC2018Source:
    """Reader for both CPSC2018 forms; labels are names from CLASS_NAMES, primary first."""

    name = "cpsc2018"

    def __init__(self, label_view: str = "first"):
        if label_view not in LABEL_VIEWS:
            raise ValueError(f"label_view must be one of {LABEL_VIEWS}, got {label_view!r}")
        self.label_view = label_view
        self.multilabel = label_view == "multi"
        self.class_names: tuple[str, ...] = () if label_view == "none" else CLASS_NAMES

    def list_records(self, root: Path) -> list[RecordRef]:
        root = require_root(root)
        refs: list[RecordRef] = []
        for folder, files in walk(root):
            if any(f.endswith(".hea") for f in files):
                refs += [RecordRef(self.name, f[:-4], str(folder / f[:-4]), {"form": "cinc"})
                         for f in files if f.endswith(".hea")]
                refs += [no_header_ref(self.name, d.name, d, form="cinc")
                         for d in orphan_data_files(folder, files)]
                continue
            mats = [f for f in files if f.endswith(".mat")]
            # The original release is .mat only: a .dat here is a WFDB file without its header.
            refs += [no_header_ref(self.name, d.name, d, form="cinc")
                     for d in orphan_data_files(folder, files, [f for f in files if f.endswith(".dat")])]
            if not mats:
                continue
            reference = _reference_rows(folder, root)
            for f in mats:
                row = reference.get(f[:-4])
                refs.append(RecordRef(self.name, f[:-4], str(folder / f),
                                      {"form": "original", "labels": None if row is None else row[0],
                                       "unrecognised": None if row is None else row[1]}))
        if not refs:
            raise no_records(self.name, root, f"no .hea or {'/'.join(DATA_SUFFIXES)} files")
        return sorted(refs, key=lambda r: r.path)

    def read(self, ref: RecordRef) -> Record:
        raise_listing_error(ref)
        if ref.extra.get("form") == "original":
            return self._read_original(ref)
        return self._read_cinc(ref)

    def view(self, path: str, labels: list[str], codes: list[str], unrecognised: list[str],
             what: str) -> tuple[str, ...]:
        """Labels (primary first) -> this view's labels, or RecordError if the view excludes the record."""
        if self.label_view == "none":
            return ()
        require_task_label(path, tuple(labels), self.class_names, codes, unrecognised, what)
        if self.label_view == "single" and len(labels) != 1:
            raise RecordError(path, f"not single-label: classes [{', '.join(labels)}]")
        return (labels[0],) if self.label_view == "first" else tuple(labels)

    def _read_original(self, ref: RecordRef) -> Record:
        labels = ref.extra.get("labels")
        if labels is None:
            raise RecordError(ref.path, f"no REFERENCE.csv row: {ref.record_id}")
        unrecognised = ref.extra.get("unrecognised") or []
        # Checked before the file is opened, like PTB-XL's views.
        view = self.view(ref.path, labels, labels + unrecognised, unrecognised, "REFERENCE.csv labels")
        data, meta = _load_original_mat(ref.path)
        return Record(self.name, ref.record_id, data, FS_ORIGINAL, STANDARD_LEADS, None, view, ref.path,
                      {"form": "original", "labels_all": labels, "unrecognised_codes": unrecognised, **meta})

    def _read_cinc(self, ref: RecordRef) -> Record:
        sig = read_wfdb(ref.path)
        fields = header_fields(sig.comments)
        tokens = split_codes(fields.get("dx", ""))
        if not tokens:
            raise RecordError(ref.path, "no #Dx labels in header")
        unknown_abbr = [t for t in tokens if not t.isdigit() and t not in _TOKEN_TO_CLASS]
        if unknown_abbr:
            raise RecordError(ref.path, f"unknown CPSC label(s) in #Dx: {unknown_abbr}",
                              unrecognised_codes=unknown_abbr)
        labels = list(dict.fromkeys(_TOKEN_TO_CLASS[t] for t in tokens if t in _TOKEN_TO_CLASS))
        unrecognised = [t for t in tokens if t not in _TOKEN_TO_CLASS]
        view = self.view(ref.path, labels, tokens, unrecognised, "#Dx codes")
        meta = {"form": "cinc", "dx": tokens, "labels_all": labels, "unrecognised_codes": unrecognised,
                "age": as_age(fields.get("age")), "sex": fields.get("sex"), "header_quirks": sig.quirks}
        return Record(self.name, ref.record_id, sig.signal, sig.fs, sig.lead_names,
                      patient_from_comments(sig.comments), view, ref.path, meta)


def _reference_rows(folder: Path, root: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Recording -> (class names in column order, cells that are no class number 1-9) from the
    nearest REFERENCE.csv at or above `folder`."""
    for d in [folder, *folder.parents]:
        csv = d / "REFERENCE.csv"
        if csv.is_file():
            table = pd.read_csv(csv, dtype=str, keep_default_na=False)
            label_cols = [c for c in table.columns if c.lower().endswith("_label")]  # First, Second, Third
            out = {}
            for row in table.to_dict("records"):
                labels, other = [], []
                for cell in (str(row[c]).strip() for c in label_cols):
                    if not cell:
                        continue
                    try:
                        labels.append(REFERENCE_CODES[int(float(cell))])
                    except (ValueError, KeyError):
                        other.append(cell)
                out[str(row["Recording"]).strip()] = (list(dict.fromkeys(labels)), other)
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
        variables = sorted(k for k in mat if not k.startswith('__'))
        raise RecordError(path, f"no struct 'ECG' in .mat (variables: {variables})")
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
