"""A corpus from recordings already in memory: the `arrays` reader, without writing files first.

    from coreecg.data import build_corpus_from_arrays
    build_corpus_from_arrays(x, fs=500, leads=["I", "II", ...], output_dir="corpora/mine",
                             patient_ids=pids, labels=[["AF"], ["NORM"], ...])

`x` is (records, leads, samples) in millivolts. The arrays go to a scratch folder beside the
corpus (never in it: it holds the patient ids as given), owner-only, as `signals.npy` and its index
CSV (the `arrays` source's own format); the corpus is built from there exactly as `--source arrays`
would build it (same preprocessing, quarantine, salted patient ids), and the scratch folder is
removed. Beside the output, it is on the storage the Ray workers read the output from (a cluster's
shared disk), and its place depends only on the output folder, so an interrupted build resumes.
"""
from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from coreecg.config import DataConfig
from coreecg.data.patient_ids import PatientIdPolicy
from coreecg.data.record import RecordError
from coreecg.data.sources.arrays import INDEX_COLUMNS
from coreecg.data.sources.exports import millivolts_per
from coreecg.cluster import init_ray
from coreecg.data.pipeline import build_corpus

# Lazy imports: ray, where the corpus is written: the light install (no Ray) builds corpora too.


def build_corpus_from_arrays(signals: Any, fs: float | Sequence[float], leads: Sequence[str], output_dir: str | Path,
                             *, record_ids: Sequence[str] | None = None,
                             patient_ids: Sequence[str | None] | None = None,
                             labels: Sequence[Sequence[str]] | Mapping[str, Sequence[str]] | None = None,
                             class_map: Mapping[str, str] | None = None, units: str = "mV",
                             cfg: DataConfig | None = None, patient_id_policy: PatientIdPolicy | None = None
                             ) -> dict[str, Any]:
    """Build (or resume) a corpus at `output_dir` from arrays in memory -> its manifest (+ "run").

    signals: (records, leads, samples), any float dtype, in `units`; fs: Hz, one for all or one per
    record; leads: the lead names of axis 1; record_ids: default "0", "1", ... (stored as salted
    keys like the patient ids; the map back is at the returned run["record_map"], outside the corpus);
    patient_ids: hospital ids (stored salted unless `patient_id_policy.keep`), default none (each
    record its own patient); labels: per record (in order) or {record_id: codes}, through `class_map` {code: class}
    (default: each code is a class); without labels the corpus is unlabelled (pretraining). Starts a
    local Ray if none is running (`coreecg.cluster.init_ray`).
    """
    out = Path(output_dir).expanduser().resolve()
    scratch = out.parent / f".{out.name}.arrays-scratch"
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True, mode=0o700)
    try:
        arrays_to_folder(signals, fs, leads, scratch, record_ids=record_ids, patient_ids=patient_ids, units=units)
        options: dict[str, Any] = {}
        if labels is not None:
            options["labels"] = str(_write_labels(scratch, labels, record_ids, len(signals)))
            if class_map:
                options["class_map"] = str(_write_class_map(scratch, class_map))
        _ensure_ray()
        return build_corpus("arrays", scratch, out, cfg or DataConfig(), source_options=options,
                            patient_ids=patient_id_policy)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def arrays_to_folder(signals: Any, fs: float | Sequence[float], leads: Sequence[str], folder: Path | str,
                     record_ids: Sequence[str] | None = None, patient_ids: Sequence[str | None] | None = None,
                     units: str = "mV") -> Path:
    """Write `signals` (records, leads, samples) as folder/signals.npy and its index
    folder/signals.csv (the `arrays` reader's format, coreecg.data.sources.arrays); `fs` one rate
    or one per record, `leads` the names of axis 1, `record_ids` default '0', '1', ...; returns
    `folder`. ValueError naming what does not fit."""
    x = np.asarray(signals)
    if x.ndim != 3 or 0 in x.shape:
        raise ValueError(f"signals must be (records, leads, samples) with none empty, got shape {x.shape}")
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise ValueError(f"signals hold {x.dtype}, not real numbers")
    n = x.shape[0]
    rates = [float(fs)] * n if np.ndim(fs) == 0 else [float(r) for r in fs]  # type: ignore[union-attr]
    if len(rates) != n:
        raise ValueError(f"fs has {len(rates)} rates for {n} records")
    if not all(np.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"fs must be > 0 Hz, got {sorted(set(rates))[:3]}")
    names = [str(name).strip() for name in leads]
    if len(names) != x.shape[1]:
        raise ValueError(f"{len(names)} lead names for {x.shape[1]} leads (signals axis 1 of shape {x.shape})")
    if any(not name or re.search(r"[;,]", name) for name in names):
        raise ValueError(f"lead names must be non-empty, without ';' or ',': {names}")
    ids = [str(r).strip() for r in record_ids] if record_ids is not None else [str(i) for i in range(n)]
    if len(ids) != n or len(set(ids)) != n or not all(ids):
        raise ValueError(f"record_ids must be {n} distinct non-empty ids, got {len(ids)} ({len(set(ids))} distinct)")
    patients = list(patient_ids) if patient_ids is not None else [None] * n
    if len(patients) != n:
        raise ValueError(f"{len(patients)} patient_ids for {n} records")
    try:
        millivolts_per(units, "units", "argument")
    except RecordError as exc:
        raise ValueError(exc.reason) from None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "signals.npy", x)
    with open(folder / "signals.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*INDEX_COLUMNS, "units"])
        for rid, patient, rate in zip(ids, patients, rates):
            writer.writerow([rid, "" if patient is None else patient, repr(rate), ";".join(names), units])
    return folder


def _write_labels(folder: Path, labels: Any, record_ids: Sequence[str] | None, n: int) -> Path:
    ids = [str(r) for r in record_ids] if record_ids is not None else [str(i) for i in range(n)]
    if isinstance(labels, Mapping):
        rows = [(str(k), list(v)) for k, v in labels.items()]
    else:
        if len(labels) != n:
            raise ValueError(f"labels: {len(labels)} entries for {n} records")
        rows = list(zip(ids, (list(v) for v in labels)))
    path = folder / "labels.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["record_id", "labels"])
        w.writerows((rid, ";".join(str(c) for c in codes)) for rid, codes in rows)
    return path


def _write_class_map(folder: Path, class_map: Mapping[str, str]) -> Path:
    path = folder / "class_map.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["code", "class"])
        w.writerows((str(k), str(v)) for k, v in class_map.items())
    return path


def _ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        init_ray()
