"""PhysioNet/CinC Challenge 2021 records: WFDB `.hea` + `.mat` with `#Dx:` SNOMED-CT codes,
plus Shandong Provincial Hospital (SPH) `.h5` files indexed by `metadata.csv`.

The database a record comes from is not in the header; it follows from the record id
(see `subset_of`), goes into `ref.extra["subset"]` and `record.meta["subset"]`, and
`subsets=(...)` restricts listing to some of them. Labels are the classes of the chosen
class map (`coreecg.data.sources.cinc2021_labels`); all raw codes stay in meta
(`dx_codes`, `unmapped_codes`: outside the class map; `unrecognised_codes`: in neither
challenge table). With a class map, a record with none of its classes raises "no label of
the task" (e.g. CinC 2020 CPSC headers whose #Dx holds abbreviations such as "AF"); use
class_map="none" to keep every record unlabelled. The challenge headers carry no patient ids: patient_id comes
from a header comment if one names it (`wfdb_io.PATIENT_FIELDS`), else None; SPH's
metadata.csv has Patient_ID. A `.mat` without its header is listed and read as "no header".

SPH: `ecg` dataset (12, N) float16 in mV, leads in the standard order I..V6 (SPH data
descriptor, Liu et al. 2022), fs and N from metadata.csv; labels from its SNOMEDCTCode
column (AHA codes are kept in meta; no AHA->SNOMED table is shipped here).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import pandas as pd
import h5py

from coreecg.data.record import STANDARD_LEADS, Record, RecordError, RecordRef
from coreecg.data.sources.base import (
    as_age, map_labels, no_header_ref, no_records, orphan_data_files, raise_listing_error, require_root,
    require_task_label, split_codes, walk,
)
from coreecg.data.sources._cinc2021_dx_table import DX_ROWS
from coreecg.data.sources.cinc2021_labels import ClassMap, build_class_map
from coreecg.data.sources.registry import register_source
from coreecg.data.sources.wfdb_io import header_fields, patient_from_comments, read_wfdb

# Record-id prefix -> database, as released in the challenge (SPH before S).
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("SPH", "SPH"), ("HR", "PTB-XL"), ("JS", "Chapman-Shaoxing/Ningbo"), ("A", "CPSC"),
    ("Q", "CPSC-Extra"), ("I", "StPetersburg"), ("S", "PTB"), ("E", "Georgia"),
)
# Chapman-Shaoxing and Ningbo share the JS prefix: JS00001-JS10646 are Chapman-Shaoxing,
# JS10647-JS45551 Ningbo (the challenge's WFDB_ChapmanShaoxing / WFDB_Ningbo split).
LAST_CHAPMAN_JS = 10646
SUBSETS: tuple[str, ...] = ("CPSC", "CPSC-Extra", "StPetersburg", "PTB", "PTB-XL", "Georgia",
                            "Chapman-Shaoxing", "Ningbo", "SPH")
_ID_RE = re.compile(r"^([A-Z]+)(\d+)$")
# Every SNOMED-CT code of the two challenge tables: others are counted as unrecognised.
KNOWN_CODES: frozenset[str] = frozenset(row[0] for row in DX_ROWS)   # (code, abbr, dx, scored, counts)


def subset_of(record_id: str) -> str:
    """'JS20000' -> 'Ningbo', 'E00001' -> 'Georgia', ...; 'unknown' for other ids."""
    m = _ID_RE.match(record_id)
    if not m:
        return "unknown"
    prefix, number = m[1], int(m[2])
    for p, subset in _PREFIXES:
        if prefix == p:
            if p == "JS":
                return "Chapman-Shaoxing" if number <= LAST_CHAPMAN_JS else "Ningbo"
            return subset
    return "unknown"


@dataclass
class CinC2021Options:
    """The config section data.sources.cinc2021."""

    # auto: ningbo25 when subsets is exactly [Ningbo] (the paper's Ningbo task has 25 classes: AF
    # never occurs there, and a never-positive output would inflate micro ACC), else scored26
    class_map: Literal["auto", "scored26", "ningbo25", "frequent", "none"] = "auto"
    min_count: int = 1                # class_map=frequent: codes seen at least this often ...
    count_column: str = "Total"       # ... in this column of the challenge tables
    subsets: tuple[str, ...] = ()     # e.g. [Ningbo]; empty = every database found
    # "": the class map's statements; a registered task of the headers' metadata (coreecg.data.tasks: age, sex)
    task: str = ""

    def reader_options(self, data: Any) -> dict[str, Any]:
        """Constructor options: subsets as a list (None: all), class_map "auto" resolved."""
        subsets = list(self.subsets) or None
        class_map = self.class_map
        if class_map == "auto":
            class_map = "ningbo25" if subsets == ["Ningbo"] else "scored26"
        return {"class_map": class_map, "min_count": self.min_count, "count_column": self.count_column,
                "subsets": subsets, **({"task": self.task} if self.task else {})}


def dataset_key(manifest: dict[str, Any]) -> str:
    """One database of the challenge is a dataset of its own: subsets [Ningbo] -> ningbo."""
    subsets = (manifest.get("source_options") or {}).get("subsets") or []
    return str(subsets[0]).lower() if len(subsets) == 1 else "cinc2021"


@register_source("cinc2021", options=CinC2021Options, dataset_key=dataset_key, dataset_label={"ningbo": "Ningbo"})
class CinC2021Source:
    """CinC 2021 reader.

    class_map: "scored26" (default), "ningbo25", "frequent" (with min_count, count_column),
    or "none"; see cinc2021_labels. subsets: only list records of these databases
    (names from SUBSETS), e.g. the Ningbo task is
    get_source("cinc2021", class_map="ningbo25", subsets=["Ningbo"]).
    """

    name = "cinc2021"
    multilabel = True
    unlabelled_view = {"class_map": "none"}     # a task's records need no statement (coreecg.data.tasks)

    def __init__(self, class_map: str = "scored26", min_count: int = 1, count_column: str = "Total",
                 subsets: Sequence[str] | None = None):
        self.class_map: ClassMap = build_class_map(class_map, min_count=min_count,
                                                   count_column=count_column)
        self.class_names = self.class_map.class_names
        if subsets is not None:
            unknown = sorted(set(subsets) - set(SUBSETS))
            if unknown:
                raise ValueError(f"unknown subsets {unknown}; known: {', '.join(SUBSETS)}")
        self.subsets = None if subsets is None else tuple(subsets)

    def list_records(self, root: Path) -> list[RecordRef]:
        root = require_root(root)
        refs = []
        for folder, files in walk(root):
            refs += [RecordRef(self.name, f[:-4], str(folder / f[:-4]),
                               {"format": "wfdb", "subset": subset_of(f[:-4])})
                     for f in files if f.endswith(".hea")]
            refs += [no_header_ref(self.name, d.name, d, format="wfdb", subset=subset_of(d.stem))
                     for d in orphan_data_files(folder, files)]
            h5s = [f for f in files if f.endswith(".h5")]
            if not h5s:
                continue
            meta_csv = folder / "metadata.csv"
            rows = {}
            if meta_csv.is_file():
                table = pd.read_csv(meta_csv, dtype=str, keep_default_na=False)
                rows = {Path(r["ECG_ID"]).stem: dict(r) for r in table.to_dict("records")}
            for f in h5s:
                stem = f[:-3]
                refs.append(RecordRef(self.name, stem, str(folder / f),
                                      {"format": "sph", "subset": "SPH", "metadata": rows.get(stem)}))
        if self.subsets is not None:
            refs = [r for r in refs if r.extra["subset"] in self.subsets]
        if not refs:
            raise no_records(self.name, root, "no .hea, .mat or SPH .h5 files"
                             + (f" of subsets {list(self.subsets)}" if self.subsets else ""))
        return sorted(refs, key=lambda r: r.path)

    def read(self, ref: RecordRef) -> Record:
        raise_listing_error(ref)
        if ref.extra.get("format") == "sph":
            return self._read_sph(ref)
        sig = read_wfdb(ref.path)
        fields = header_fields(sig.comments)
        codes = split_codes(fields.get("dx", ""))
        if not codes and self.class_names:
            raise RecordError(ref.path, "no #Dx codes in header")
        return self._record(ref, sig.signal, sig.fs, sig.lead_names, patient_from_comments(sig.comments),
                            codes, {"age": as_age(fields.get("age")), "sex": fields.get("sex"),
                                    "header_quirks": sig.quirks})

    def _read_sph(self, ref: RecordRef) -> Record:
        row = ref.extra.get("metadata")
        if row is None:
            raise RecordError(ref.path, f"no metadata.csv row: {ref.record_id}")
        data = _read_sph_h5(ref.path)
        try:
            fs, n = float(row["fs"]), int(row["N"])
        except (KeyError, ValueError) as exc:
            raise RecordError(ref.path, f"metadata.csv row lacks fs/N: {exc}") from exc
        if data.shape[1] != n:
            raise RecordError(ref.path, f"header/data mismatch: h5 has {data.shape[1]} samples, "
                                        f"metadata.csv says N={n}")
        if "SNOMEDCTCode" not in row and self.class_names:
            raise RecordError(ref.path, "metadata.csv has no SNOMEDCTCode column "
                                        "(AHA codes alone cannot be mapped)")
        codes = split_codes(row.get("SNOMEDCTCode", ""))
        meta = {"age": as_age(row.get("Age")), "sex": row.get("Sex") or None,
                "aha_codes": split_codes(row.get("AHA_Code", ""), ";")}
        return self._record(ref, data, fs, STANDARD_LEADS, row.get("Patient_ID") or None, codes, meta)

    def _record(self, ref: RecordRef, signal: np.ndarray, fs: float, leads: tuple[str, ...],
                patient_id: str | None, codes: list[str], meta: dict) -> Record:
        labels, unmapped = map_labels(codes, self.class_map.code_to_class, self.class_names)
        unrecognised = [c for c in codes if c not in KNOWN_CODES]
        what = "#Dx codes" if ref.extra.get("format") == "wfdb" else "SNOMEDCTCode codes"
        hint = ""
        if unrecognised:
            hint = f"{', '.join(unrecognised)}: in neither challenge table"
            if any(not c.isdigit() for c in unrecognised):
                hint += "; CinC 2020 CPSC abbreviations? read those with the cpsc2018 source"
        require_task_label(ref.path, labels, self.class_names, codes, unrecognised, what, hint)
        meta = {"subset": ref.extra["subset"], "dx_codes": codes, "unmapped_codes": unmapped,
                "unrecognised_codes": unrecognised, **meta}
        return Record(self.name, ref.record_id, signal, fs, leads, patient_id, labels, ref.path, meta)


def _read_sph_h5(path: str) -> np.ndarray:
    """SPH .h5 -> (12, N) float32 mV, or RecordError."""
    try:
        with h5py.File(path, "r") as f:
            if "ecg" not in f:
                raise RecordError(path, f"no 'ecg' dataset in h5 (keys: {sorted(f.keys())})")
            data = np.asarray(f["ecg"][()], dtype=np.float32)
    except RecordError:
        raise
    except Exception as exc:  # h5py raises OSError/KeyError variants for damaged files
        raise RecordError(path, f"unreadable h5 file: {exc}") from exc
    if data.ndim != 2 or data.shape[0] != 12:
        raise RecordError(path, f"ecg dataset has shape {data.shape}, expected (12, samples)")
    return data
