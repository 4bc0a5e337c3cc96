"""Build a corpus from a source with Ray Data: list -> shard -> read + preprocess + write.

    refs = source.list_records(root)            # cheap, on the driver
    duplicates -> quarantine                    # later refs with a record id already seen
    shards of `shard_records` refs, in listing order
    ray.data.from_items(shards).map(process_shard)   # one task per shard, all CPUs

`process_shard` reads and preprocesses its records, writes one Parquet file per split
atomically, then a resume marker `_state/shard-NNNNN.json` holding the shard's key (a hash
of its record refs and every setting that changes the output), file checksums, counts and
quarantine rows. A re-run skips a shard whose marker key matches and whose files still
have their checksums; anything else is rebuilt. The driver then writes `quarantine.csv`
and `manifest.json` from the markers, so a resumed run's manifest equals a fresh one's, and
last `fingerprints.parquet` (the leakage guard's, coreecg.data.fingerprints) from the shards.

With `exclude_overlap_with` (downstream corpora), each shard leaves out, before writing, the
records the leakage guard matches to their val/test records, and quarantines them naming the
twin (coreecg.data.exclusion); the downstream corpora are part of the shard key and the manifest.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import re
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from coreecg.config import DataConfig, PreprocessConfig
from coreecg.data.corpus import FORMAT_VERSION, MANIFEST, QUARANTINE, SIGNAL_DTYPE, windows_table, write_parquet
from coreecg.data.exclusion import (
    MANIFEST_KEY, Downstream, check_finished, excluded_records, identities, load_downstream, manifest_entry,
    patient_id_warnings, preprocess_warnings,
)
from coreecg.data.fingerprints import write_fingerprints
from coreecg.data.patient_ids import Keys, PatientIdPolicy, write_record_map
from coreecg.data.preprocess import preprocess_record, resolve_contract
from coreecg.data.record import Record, RecordError, RecordRef
from coreecg.data.sources import dataset_key, dataset_label, get_source
from coreecg.data.splits import SPLITS, patient_key, record_split
from coreecg.files import TEMP_GLOB, sha256_file, write_atomic, write_json
from coreecg.data.tasks import TaskSpec
from coreecg.version import __version__

# Lazy imports: ray.data (the `ray` extra), where the shards are processed: the light install builds corpora
# through this module (coreecg.data.from_arrays) without Ray, and jobs/preprocess.py's --help imports it
# (ray.data: 1,561 -> 2,270 modules, 0.3 s).
STATE_DIR = "_state"
# Bump when reading or preprocessing code changes what a shard holds for the same inputs and
# settings (part of every shard key, so a resumed run rebuilds old shards). 2: filter padding,
# CPSC2018 label views, "no label of the task" and header checks. 3: a record shorter than the
# window (down to min_duration_s) is one window padded with NaN.
DATA_REVISION = 3
# The most unrecognised codes a warning names (all are in the manifest).
_WARN_CODES = 10

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- one record


def check_task_label(record: Record, class_names: tuple[str, ...]) -> None:
    """RecordError when a corpus with a task gets a record with none of its classes.

    Readers refuse such records themselves, naming their codes; this is the net for any
    source that does not, so no record is stored with label -1 in a labelled corpus.
    """
    if class_names and not any(c in class_names for c in record.labels):
        raise RecordError(record.path, f"no label of the task: labels [{', '.join(record.labels)}] are none "
                                       f"of the {len(class_names)} classes")


def record_rows(record: Record, windows: np.ndarray, class_names: tuple[str, ...],
                ratios: tuple[float, float, float], target: bool = False) -> tuple[list[dict[str, Any]], Counter]:
    """Row metadata for a record's windows, and labels outside `class_names` (counted, not lost);
    `target`: a regression task's corpus, whose rows carry the record's value (coreecg.data.tasks)."""
    index = {c: i for i, c in enumerate(class_names)}
    labels = [index[c] for c in record.labels if c in index]
    outside = Counter(c for c in record.labels if c not in index)
    split = record_split(record, ratios)
    pkey = patient_key(record.patient_id, record.record_id)
    rows = [{"dataset": record.source, "record_id": record.record_id, "patient_id": pkey,
             "window_index": w, "split": split, "labels": labels} for w in range(len(windows))]
    if target:
        for row in rows:
            row["target"] = float(record.meta["target"])
    return rows, outside


# ---------------------------------------------------------------------------- one shard


def shard_key(refs: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    blob = json.dumps({"refs": refs, "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _marker_valid(marker_path: Path, key: str, out_dir: Path) -> dict[str, Any] | None:
    if not marker_path.is_file():
        return None
    marker = json.loads(marker_path.read_text())
    if marker.get("key") != key:
        return None
    for f in marker["files"]:
        p = out_dir / f["path"]
        if not p.is_file() or sha256_file(p) != f["sha256"]:
            return None
    return marker


@dataclass
class _ShardRead:
    """One shard's records, read and preprocessed: per written record (record, its rows, its
    windows, its labels outside class_names), the quarantined ones with their reasons, and what the
    shard's marker counts."""

    written: list[tuple[Record, list[dict[str, Any]], np.ndarray, Counter]] = field(default_factory=list)
    quarantine: list[dict[str, str]] = field(default_factory=list)
    notes: Counter = field(default_factory=Counter)
    unrecognised: Counter = field(default_factory=Counter)   # codes no table of the reader knows, per record read
    t_read: float = 0.0
    t_prep: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        return [r for _, rs, _, _ in self.written for r in rs]


def _read_shard(refs: list[dict[str, Any]], source: Any, cfg: PreprocessConfig, class_names: tuple[str, ...],
                ratios: tuple[float, ...], keys: Keys | None = None, target: bool = False) -> _ShardRead:
    """Read and preprocess every record of a shard; a record that fails is quarantined with the
    reason (a RecordError's, or "unreadable" naming the exception), never dropped silently.
    `keys`: patient ids (and record ids made from file names) are replaced by their salted keys as
    soon as they are read (coreecg.data.patient_ids), so no later step sees the identifier; the
    reader looked its labels up by the name as read."""
    keys = keys or Keys()
    read = _ShardRead()
    for r in refs:
        ref = RecordRef(**r)
        t0 = t1 = time.perf_counter()
        try:
            record = source.read(ref)
            record.patient_id = keys.patient(record.patient_id)
            record.record_id = keys.record(record.record_id)
            t1 = time.perf_counter()
            read.unrecognised.update(record.meta.get("unrecognised_codes", ()))
            for quirk in record.meta.get("header_quirks", ()):
                read.notes[f"header corrected: {quirk.split(' (')[0]}"] += 1
            for note in record.meta.get("notes", ()):      # what a reader noted of a record it read
                read.notes[note.split(" (")[0]] += 1
            check_task_label(record, class_names)
            windows = preprocess_record(record, cfg)
        except RecordError as e:
            read.unrecognised.update(e.unrecognised_codes)
            read.quarantine.append(keys.quarantine_row(ref.record_id, (e.path or ref.path, ref.path), e.reason))
            continue
        except Exception as e:  # a reader bug or a file format it did not foresee: still quarantined
            read.quarantine.append(keys.quarantine_row(ref.record_id, (ref.path,),
                                                       f"unreadable ({type(e).__name__}: {e})"))
            continue
        read.t_read += t1 - t0
        read.t_prep += time.perf_counter() - t1
        for lead in record.meta.get("dropped_leads", ()):
            read.notes[f"dropped extra lead {lead}"] += 1
        if record.meta.get("derived_leads"):
            read.notes[f"derived leads {', '.join(record.meta['derived_leads'])} from I and II"] += 1
        new_rows, out_labels = record_rows(record, windows, class_names, ratios, target)
        read.written.append((record, new_rows, windows, out_labels))
    return read


def _exclude_downstream(read: _ShardRead, table: pa.Table, cfg: PreprocessConfig, settings: dict[str, Any],
                        exclude: Sequence[Downstream]) -> tuple[pa.Table, list[dict[str, Any]]]:
    """Records the leakage guard matches to a downstream val/test record: out of `table` and
    `read.written`, into `read.quarantine` with the reason -> (the table, what was excluded)."""
    found = excluded_records(table, (len(cfg.leads), cfg.window_samples), settings["signal_dtype"], exclude)
    if not found:
        return table, []
    excluded = []
    table = table.filter(pa.array([rid not in found for rid in table.column("record_id").to_pylist()]))
    for record, _, windows, _ in read.written:
        if record.record_id in found:
            x = found[record.record_id]
            read.quarantine.append({"record_id": record.record_id, "path": record.path, "reason": x.reason})
            excluded.append({"record_id": record.record_id, "windows": len(windows), "downstream": list(x.downstream)})
    read.written = [w for w in read.written if w[0].record_id not in found]
    return table, excluded


def _write_split_files(out: Path, shard: int, table: pa.Table, rows: list[dict[str, Any]],
                       padded: list[bool]) -> list[dict[str, Any]]:
    """The shard's rows as one Parquet file per split -> the marker's file entries (path, rows,
    records, patients, classes, padded windows, sha256)."""
    files = []
    split_col = np.array([r["split"] for r in rows])
    for split in SPLITS:
        idx = np.flatnonzero(split_col == split)
        if idx.size == 0:
            continue
        rel = f"{split}/shard-{shard:05d}.parquet"
        files.append({"path": rel, "split": split, "rows": int(idx.size),
                      "records": len({rows[i]["record_id"] for i in idx}),
                      "patients": sorted({rows[i]["patient_id"] for i in idx}),
                      "classes": dict(Counter(c for i in idx for c in rows[i]["labels"])),
                      **({"targets": _target_sums([rows[i] for i in idx])} if "target" in rows[0] else {}),
                      "padded": int(sum(padded[i] for i in idx)),
                      "sha256": write_parquet(table.take(idx), out / rel)})
    return files


def _target_sums(rows: list[dict[str, Any]]) -> dict[str, float]:
    """A shard file's regression targets, one per record (its windows repeat it): what the manifest
    adds up into each split's n, mean, SD, min and max."""
    values = np.array(list({r["record_id"]: r["target"] for r in rows}.values()), dtype=np.float64)
    return {"n": int(len(values)), "sum": float(values.sum()), "sum_sq": float((values ** 2).sum()),
            "min": float(values.min()), "max": float(values.max())}


def _written_counts(read: _ShardRead) -> tuple[list[bool], Counter, int]:
    """What the marker counts of the written records -> (per window, whether it is padded; labels
    outside the class names; records without a patient id)."""
    # A short record's window ends in NaN padding on every lead (coreecg.data.preprocess.PAD):
    # counted per shard file, so training knows on the host whether a split holds any.
    padded = [bool(np.isnan(w[0, -1])) for _, _, ws, _ in read.written for w in ws]
    outside: Counter = Counter()
    fallbacks = 0
    for record, new_rows, _, out_labels in read.written:
        outside.update(out_labels)
        fallbacks += new_rows[0]["patient_id"] == patient_key(None, record.record_id)
    return padded, outside, fallbacks


def process_shard(item: dict[str, Any], *, source: Any, settings: dict[str, Any],
                  out_dir: str, exclude: Sequence[Downstream] = (), keys: Keys | None = None) -> dict[str, Any]:
    """Ray Data map fn: item {"shard": i, "refs": json list of RecordRef dicts} -> {"marker": json}.

    `exclude`: downstream corpora whose val/test records must not be written (their identities
    are in `settings`, hence in the shard key): records the leakage guard matches to them are
    quarantined before the shard's files are written (coreecg.data.exclusion). `keys`: the patient-id
    salt and whether record ids are keyed (settings hold only the salt's id; the salt is never written)."""
    out = Path(out_dir)
    shard = int(item["shard"])
    refs = json.loads(item["refs"])
    key = shard_key(refs, settings)
    marker_path = out / STATE_DIR / f"shard-{shard:05d}.json"
    done = _marker_valid(marker_path, key, out)
    if done is not None:
        done["skipped"] = True
        return {"marker": json.dumps(done)}

    cfg = PreprocessConfig(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in settings["preprocess"].items()})
    class_names = tuple(settings["class_names"])
    target = (settings.get("task") or {}).get("kind") == "regression"
    read = _read_shard(refs, source, cfg, class_names, tuple(settings["split_ratios"]), keys, target)
    t0 = time.perf_counter()
    table = windows_table(read.rows(), np.concatenate([w for _, _, w, _ in read.written])) if read.written else None
    t_table = time.perf_counter() - t0
    t0 = time.perf_counter()
    excluded: list[dict[str, Any]] = []     # records matched to a downstream val/test record: not written
    if exclude and table is not None:
        table, excluded = _exclude_downstream(read, table, cfg, settings, exclude)
    t_exclude = time.perf_counter() - t0
    rows = read.rows()
    padded, outside, fallbacks = _written_counts(read)
    t0 = time.perf_counter()
    files = _write_split_files(out, shard, table, rows, padded) if rows else []
    marker = {"shard": shard, "key": key, "files": files, "quarantine": read.quarantine,
              "records_in": len(refs), "records_written": len({r["record_id"] for r in rows}),
              "labels_outside_class_names": dict(outside), "notes": dict(read.notes),
              "unrecognised_codes": dict(read.unrecognised), "patient_id_fallbacks": fallbacks,
              "seconds": {"read": read.t_read, "preprocess": read.t_prep, "write": t_table + time.perf_counter() - t0}}
    if exclude:
        marker["excluded"] = excluded
        marker["seconds"]["exclude"] = t_exclude
    write_json(marker_path, marker)
    marker["skipped"] = False
    return {"marker": json.dumps(marker)}


# ---------------------------------------------------------------------------- the run


def plan(refs: list[RecordRef], shard_records: int,
         keys: Keys | None = None) -> tuple[list[list[dict[str, Any]]], list[dict[str, str]]]:
    """Deduplicate by record id (first listed wins) and cut into shards of `shard_records`; the
    duplicates' quarantine rows name no file when `keys` key record ids."""
    keys = keys or Keys()
    first: dict[str, str] = {}
    kept, dupes = [], []
    for ref in refs:
        if ref.record_id in first:
            dupes.append(keys.quarantine_row(ref.record_id, (ref.path, first[ref.record_id]),
                                             f"duplicate record id, first seen at {first[ref.record_id]}"))
            continue
        first[ref.record_id] = ref.path
        kept.append(dataclasses.asdict(ref))
    return [kept[i: i + shard_records] for i in range(0, len(kept), shard_records)], dupes


def code_version() -> dict[str, Any]:
    """coreecg's version and the git commit of this checkout (None outside git / before a commit)."""
    try:
        git = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
        sha = git.stdout.strip() if git.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        sha = None
    return {"coreecg": __version__, "git": sha}


_LEAD = r"(?:I{1,3}|aV[RLF]|AV[RLF]|V\d{1,2}|[XYZ])"
# What a reason names before its kind, replaced by the bare noun so the kind groups across them:
# "lead V6: LeadDataCRC32 mismatch", "SOP class 1.2.840...2 (CT Image Storage) is not an ECG waveform".
_REASON_SUBJECTS = (
    (re.compile(r"\bSOP class [\d.]+(?: \([^)]*\))?"), "SOP class"),
    (re.compile(rf"\b(leads?|lead\(s\)) {_LEAD}(?:, {_LEAD})*(?![\w-])"), r"\1"),
    (re.compile(r"\b(channel|member|array|signal|exam_id) (?:'[^']*'|\"[^\"]*\"|\d+)(?![\w-])"), r"\1"),
)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def reason_kind(reason: str) -> str:
    """A quarantine reason's kind, for the manifest's counts: what it names (a lead, a SOP class, a
    quoted value, a number) taken out and the details after it cut, so one kind is one line.

    'record is 6.00 s, shorter than 10 s' -> 'record is N s, shorter than N s';
    'lead V6: LeadDataCRC32 mismatch (stored 1, ...)' -> 'LeadDataCRC32 mismatch';
    'SOP class 1.2.3 (CT Image Storage) is not an ECG waveform (...)' -> 'SOP class is not an ECG waveform'.
    """
    text = reason.split(", first seen at")[0]
    for pattern, noun in _REASON_SUBJECTS:
        text = pattern.sub(noun, text)
    # "lead: what" / "SOP class: what": the subject is generic now, the kind is what follows
    subject = re.match(r"(?:leads?|lead\(s\)|channel|member|array|signal|exam_id|SOP class): (.+)", text)
    if subject:
        text = subject.group(1)
    head = re.split(r" \(|: |; ", text, maxsplit=1)[0].rstrip(":")
    head = _QUOTED.sub("'...'", head)
    return re.sub(r"\b\d+(\.\d+)?\b", "N", head).strip()


def build_corpus(source_name: str, input_dir: str | Path | None, output_dir: str | Path,
                 cfg: DataConfig | None = None, source_options: dict[str, Any] | None = None,
                 refs: list[RecordRef] | None = None, log_warnings: bool = True,
                 exclude_overlap_with: Sequence[str | Path] = (),
                 patient_ids: PatientIdPolicy | None = None) -> dict[str, Any]:
    """Write (or resume) a corpus; returns the manifest plus run statistics under "run".

    Raises FileNotFoundError (missing input), ValueError (unknown source, no records, a bad
    `exclude_overlap_with`). `refs` overrides the source's listing (tests use it to inject duplicates).
    `exclude_overlap_with`: built downstream corpus folders; every record of this corpus (any
    split) sharing a patient or a recording with their val/test records, as the leakage guard
    decides, is left out and quarantined with its twin named, and the manifest records the
    exclusion under "excluded_overlap_with" (coreecg.data.exclusion, docs/leakage.md). A finished
    corpus asked again with other downstream corpora than it was built with is a ValueError.
    The manifest's "warnings" (unrecognised diagnosis codes, records without patient id) are
    logged at the end of the run unless `log_warnings=False` (the job prints them itself).
    Needs a running Ray (`ray.init`); each shard is one Ray Data task, handed the reader itself
    (pickled by reference: a plugin's module is imported on the worker as it unpickles).
    `patient_ids`: for a source whose patient ids identify patients (hospital exports), whether to
    keep them or store salted hashes (the default; coreecg.data.patient_ids); the manifest says which.
    """
    cfg = cfg or DataConfig()
    if cfg.preprocess.contract:           # a published family's declared contract: its stored form
        cfg = dataclasses.replace(cfg, preprocess=resolve_contract(cfg.preprocess))
    source = get_source(source_name, **(source_options or {}))
    if refs is None:
        refs = source.list_records(Path(input_dir) if input_dir is not None else None)
    out = Path(output_dir)
    downstream = load_downstream(exclude_overlap_with, out)
    check_finished(out, downstream)       # before anything is written over a finished corpus
    out.mkdir(parents=True, exist_ok=True)
    settings = _shard_settings(source, source_options or {}, cfg, downstream)
    policy = patient_ids or PatientIdPolicy()
    keys = _patient_keys(source, policy, out, settings)
    shards, dupes = plan(refs, cfg.shard_records, keys)
    record_map = None
    if keys.key_records:   # the owner's way back from a key to the file, written before any shard
        record_map = write_record_map(policy.map_file(out), ((keys.record(r.record_id), r.record_id, r.path)
                                                             for r in refs))
    markers, wall = _process_shards(shards, source, settings, out, downstream, keys)
    manifest = _write_manifest(out, source, input_dir, cfg, settings, markers, refs, dupes, keys, downstream)
    t_fp = time.perf_counter()
    write_fingerprints(out)           # the leakage guard's (coreecg.data.overlap), stamped with this manifest
    t_fp = time.perf_counter() - t_fp
    for message in manifest["warnings"] if log_warnings else ():  # after Ray Data's progress output
        log.warning(message)
    stale = _remove_stale(out, {f["path"] for m in markers for f in m["files"]}, len(shards))
    return {**manifest, "run": _run_stats(markers, wall, len(shards), t_fp, stale, record_map)}


def _shard_settings(source: Any, source_options: dict[str, Any], cfg: DataConfig,
                    downstream: Sequence[Downstream]) -> dict[str, Any]:
    """Everything that changes a shard's bytes (part of its key: a shard whose key differs is
    rebuilt on resume)."""
    settings = {"format_version": FORMAT_VERSION, "coreecg": __version__, "data_revision": DATA_REVISION,
                "source": source.name, "source_options": source_options,
                "label_view": getattr(source, "label_view", None),
                "preprocess": cfg.preprocess.settings(), "split_ratios": list(cfg.split_ratios),
                "class_names": list(source.class_names), "signal_dtype": np.dtype(SIGNAL_DTYPE).name}
    if downstream:   # only then: the keys of corpora built without an exclusion stay as they were
        settings["exclude_overlap_with"] = identities(downstream)
    task = getattr(source, "task", None)
    if isinstance(task, TaskSpec):   # only then: the keys of label corpora stay as they were
        settings["task"] = task.describe()
    return settings


def _patient_keys(source: Any, policy: PatientIdPolicy, out: Path, settings: dict[str, Any]) -> Keys:
    """The patient-id keys of a source whose ids identify patients (hospital exports), their salt's
    id added to `settings`; plain Keys (ids kept) for any other source."""
    if not getattr(source, "identifying_patient_ids", False):   # the keys of other corpora stay as they were
        return Keys()
    settings["patient_ids"], keys = policy.resolve(out)
    return keys


def _process_shards(shards: list[list[dict[str, Any]]], source: Any, settings: dict[str, Any], out: Path,
                    downstream: Sequence[Downstream], keys: Keys) -> tuple[list[dict[str, Any]], float]:
    """Every shard through `process_shard`, one Ray Data task each (all CPUs) -> (their markers in
    shard order, wall seconds)."""
    import ray.data

    t0 = time.perf_counter()
    markers: list[dict[str, Any]] = []
    if shards:
        items = [{"shard": i, "refs": json.dumps(s)} for i, s in enumerate(shards)]
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        ds = ds.map(process_shard, fn_kwargs={"source": source, "settings": settings, "out_dir": str(out),
                                              "exclude": downstream, "keys": keys}, num_cpus=1)
        markers = sorted((json.loads(r["marker"]) for r in ds.take_all()), key=lambda m: m["shard"])
    return markers, time.perf_counter() - t0


def _write_manifest(out: Path, source: Any, input_dir: Any, cfg: DataConfig, settings: dict[str, Any],
                    markers: list[dict[str, Any]], refs: list[RecordRef], dupes: list[dict[str, str]], keys: Keys,
                    downstream: Sequence[Downstream]) -> dict[str, Any]:
    """quarantine.csv (the duplicates, then every shard's rows) and manifest.json, from the
    markers -> the manifest."""
    quarantine = dupes + [q for m in markers for q in m["quarantine"]]
    write_atomic(out / QUARANTINE, lambda tmp: _write_csv(tmp, quarantine))
    manifest = _manifest(source, None if keys.key_records else input_dir, cfg, settings, markers, refs, quarantine)
    if keys.key_records:                  # the manifest names no input file: tables by their content
        manifest["source_options"] = {k: _by_content(v) if k in _FILE_OPTIONS and v else v
                                      for k, v in manifest["source_options"].items()}
    # the source's dataset key and table label, recorded now: fine-tuning and the report read them
    # from here, without the source's module (a plugin) importable then
    manifest.update(dataset_key=dataset_key(manifest), dataset_label=dataset_label(manifest))
    if downstream:
        manifest[MANIFEST_KEY] = manifest_entry(downstream, markers)
        manifest["warnings"] += preprocess_warnings(downstream, settings["preprocess"])
        manifest["warnings"] += patient_id_warnings(downstream, manifest["patient_ids"], source.name)
    write_json(out / MANIFEST, manifest)
    return manifest


def _run_stats(markers: list[dict[str, Any]], wall: float, n_shards: int, fingerprint_s: float, stale: list[str],
               record_map: Path | None) -> dict[str, Any]:
    """The manifest's "run": this run's speed, over the shards it did not skip."""
    seconds: Counter = Counter()
    for m in markers:
        if not m["skipped"]:
            seconds.update(m["seconds"])
    return {"wall_s": wall, "shards": n_shards, "shards_skipped": sum(m["skipped"] for m in markers),
            "records_per_s": (sum(m["records_in"] for m in markers if not m["skipped"]) / wall) if wall else 0.0,
            "task_seconds": dict(seconds), "fingerprint_s": fingerprint_s, "stale_files_removed": stale,
            "record_map": str(record_map) if record_map else None}


# Reader options that name input files (export readers' labels tables).
_FILE_OPTIONS = ("labels", "class_map")


def _by_content(path: str) -> str:
    """A file option as the manifest of a keyed corpus records it: its content's hash, not its name."""
    p = Path(path).expanduser()
    return f"sha256:{sha256_file(p)[:16]}" if p.is_file() else "given (not recorded: the corpus names no input file)"


def _write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["record_id", "path", "reason"])
        w.writeheader()
        w.writerows(rows)


def _remove_stale(out: Path, keep: set[str], n_shards: int) -> list[str]:
    """Shard files and markers a previous run with other inputs left behind (not in this manifest),
    and the temporary files of writes a killed run cut short (`coreecg.files.write_atomic`'s .NAME.tmp-PID)."""
    removed = []
    for folder in (out, out / STATE_DIR, *(out / split for split in SPLITS)):
        for f in sorted(folder.glob(TEMP_GLOB)):
            f.unlink(missing_ok=True)
            removed.append(str(f.relative_to(out)))
    for split in SPLITS:
        for f in sorted((out / split).glob("shard-*.parquet")):
            if f"{split}/{f.name}" not in keep:
                f.unlink()
                removed.append(f"{split}/{f.name}")
    for f in sorted((out / STATE_DIR).glob("shard-*.json")):
        if int(f.stem.split("-")[1]) >= n_shards:
            f.unlink()
            removed.append(f"{STATE_DIR}/{f.name}")
    return removed


def _manifest(source: Any, input_dir: Any, cfg: DataConfig, settings: dict[str, Any],
              markers: list[dict[str, Any]], refs: list[RecordRef], quarantine: list[dict[str, str]]) -> dict[str, Any]:
    files = [f for m in markers for f in m["files"]]
    windows = {s: sum(f["rows"] for f in files if f["split"] == s) for s in SPLITS}
    records = {s: sum(f["records"] for f in files if f["split"] == s) for s in SPLITS}
    # None: a shard written before the count existed (unknown, so treated as padded).
    padded = {s: (None if any("padded" not in f for f in files if f["split"] == s)
                  else sum(f["padded"] for f in files if f["split"] == s)) for s in SPLITS}
    patients = {s: len({p for f in files if f["split"] == s for p in f["patients"]}) for s in SPLITS}
    classes = {s: {c: sum(f["classes"].get(str(i), 0) for f in files if f["split"] == s)
                   for i, c in enumerate(source.class_names)} for s in SPLITS}
    outside: Counter = Counter()
    notes: Counter = Counter()
    unrecognised: Counter = Counter()
    for m in markers:
        outside.update(m["labels_outside_class_names"])
        notes.update(m["notes"])
        unrecognised.update(m["unrecognised_codes"])
    reasons = Counter(reason_kind(q["reason"]) for q in quarantine)
    written = sum(m["records_written"] for m in markers)
    fallbacks = sum(m["patient_id_fallbacks"] for m in markers)
    n_leads, n_samples = len(cfg.preprocess.leads), cfg.preprocess.window_samples
    return {
        "format": "coreecg-corpus", "format_version": FORMAT_VERSION,
        "source": source.name, "source_options": settings["source_options"],
        "input": str(input_dir) if input_dir is not None else None,
        "class_names": list(source.class_names), "multilabel": bool(source.multilabel),
        "signal": {"shape": [n_leads, n_samples], "dtype": settings["signal_dtype"],
                   "leads": list(cfg.preprocess.leads), "sampling_rate": cfg.preprocess.sampling_rate},
        "preprocess": settings["preprocess"], "split_ratios": list(cfg.split_ratios),
        "shard_records": cfg.shard_records, "code_version": code_version(),
        "label_view": settings["label_view"],
        # hospital identifiers: salted hashes (the salt's id, never the salt) or kept as read
        "patient_ids": settings.get("patient_ids", {"stored": "as read"}),
        # how records were put in splits: "patients" (hash at split_ratios) or a source's own rule
        "split_rule": getattr(source, "split_rule", "patients"),
        "counts": {"records_listed": len(refs),
                   "records_written": written,
                   "records_quarantined": len(quarantine),
                   "patient_id_fallbacks": fallbacks,
                   "quarantine_reasons": dict(reasons),
                   "windows": windows, "padded_windows": padded, "records": records, "patients": patients,
                   "classes": classes,
                   "windows_total": sum(windows.values())},
        "labels_outside_class_names": dict(outside), "notes": dict(notes),
        "unrecognised_codes": dict(unrecognised.most_common()),
        "warnings": _warnings(source.name, written, fallbacks, unrecognised, outside),
        "shards": [{"path": f["path"], "split": f["split"], "rows": f["rows"], "sha256": f["sha256"]}
                   for f in files],
        **({"task": _task_entry(settings["task"], files, quarantine)} if settings.get("task") else {}),
    }


def _task_entry(task: dict[str, Any], files: list[dict[str, Any]], quarantine: list[dict[str, str]]) -> dict[str, Any]:
    """The manifest's "task" (coreecg.data.tasks): its description, the records left out for a missing or
    an implausible target, and a regression task's target statistics per split (one value per record)."""
    out = {**task, "missing_targets": sum(q["reason"].startswith("missing target") for q in quarantine),
           "implausible_targets": sum(q["reason"].startswith("implausible ") for q in quarantine)}
    if task.get("kind") == "regression":
        stats = {}
        for split in SPLITS:
            parts = [f["targets"] for f in files if f["split"] == split and "targets" in f]
            n = sum(p["n"] for p in parts)
            if not n:
                continue
            mean = sum(p["sum"] for p in parts) / n
            var = max(0.0, sum(p["sum_sq"] for p in parts) / n - mean ** 2)
            stats[split] = {"n": n, "mean": mean, "sd": float(np.sqrt(var * n / max(1, n - 1))),
                            "min": min(p["min"] for p in parts), "max": max(p["max"] for p in parts)}
        out["targets"] = stats
    return out


def _warnings(source: str, written: int, fallbacks: int, unrecognised: Counter, outside: Counter) -> list[str]:
    """What a run's user must know although nothing failed: unknown codes, patient-id fallbacks."""
    out = []
    if unrecognised:
        top = ", ".join(f"{code} x{n}" for code, n in unrecognised.most_common(_WARN_CODES))
        more = f" and {len(unrecognised) - _WARN_CODES} more" if len(unrecognised) > _WARN_CODES else ""
        out.append(f"{sum(unrecognised.values())} diagnosis code(s) not recognised by the {source} reader "
                   f"({len(unrecognised)} distinct: {top}{more}); counts per code in manifest "
                   f"'unrecognised_codes'")
    if fallbacks:
        out.append(f"{fallbacks} of {written} written record(s) have no patient id and count as their own "
                   f"patient (record:<id>): records of one patient may sit in different splits")
    if outside:
        out.append(f"labels outside the class names: {dict(outside)}")
    return out
