"""A pretraining corpus built without the downstream corpora's val/test records (docs/leakage.md,
"Excluding the downstream records from a pretraining corpus").

Public databases hide each other (CinC 2021 holds PTB-XL's records as HR*, a MIMIC-layout folder
holds PTB-XL records under MIMIC names), so the leakage guard would refuse every fine-tuning of an
encoder pretrained on such a mixture. `build_corpus(..., exclude_overlap_with=[downstream, ...])`
instead leaves those records out while the corpus is built:

    driver     `load_downstream`: each downstream folder must be a built corpus; its val + test
               fingerprints (the guard's, `corpus_fingerprints`) travel to every shard task, and
               its path + val/test records sha256 join the shard key and the manifest
    each shard `excluded_records`: the shard's windows, fingerprinted exactly as the stored float16
               windows are, are compared with each downstream's val/test by the guard's own
               `coreecg.data.overlap.compare` (patient and signal, same thresholds); the records
               found are never written, each gets a quarantine row naming its twin
    driver     `manifest_entry`: which downstream corpora, how many records/windows removed

Only the downstream's val and test splits are excluded (GUARDED_SPLITS, what the guard compares):
a fine-tuning's numbers are measured there, while pretraining on records of its train split is
what every fine-tuning on that corpus already does (its own supervised training reads them).
Every split of the new corpus is filtered: a record moves nowhere, it is just not written.

Matching is window against window, so comparing shard by shard finds exactly what comparing the
whole corpus at once finds; filtering before the shard files and the manifest are written keeps
an interrupted build resumable (a finished shard's marker holds its exclusions) and a finished
corpus never half-rewritten. A finished corpus asked again with other downstream corpora (or none,
or one whose val/test records changed) is an error: its shards would silently hold another record set.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd
import pyarrow as pa

from coreecg.data.corpus import MANIFEST, CorpusError, open_corpus, signal_view
from coreecg.data.fingerprints import corpus_fingerprints, fingerprint_table, window_fingerprints
from coreecg.data.overlap import GUARDED_SPLITS, compare, only_splits
from coreecg.data.patient_ids import comparable_warning

MANIFEST_KEY = "excluded_overlap_with"     # the manifest's record of the exclusion (absent: none)
REASON_TAIL = "leakage guard; excluded from pretraining"


@dataclass(frozen=True)
class Excluded:
    """A record of the corpus being built that the guard would name: why (its quarantine reason)
    and which downstream corpora it shares something with."""

    reason: str
    downstream: tuple[str, ...]


@dataclass(frozen=True)
class Downstream:
    """A downstream corpus whose val/test records a pretraining corpus must not hold: its resolved
    path, the sha256 of its val/test fingerprint rows (which records those are, whatever commit
    or build time its manifest names) and those fingerprints."""

    path: str
    records_sha256: str         # its val/test windows' fingerprints: which records, not when built
    fingerprints: pa.Table
    preprocess: dict[str, Any]
    patient_ids: dict[str, Any] | None = None       # its manifest's: salted or as read (patient_ids.py)

    @property
    def identity(self) -> dict[str, str]:
        """What the shard key and the manifest record of it."""
        return {"path": self.path, "records_sha256": self.records_sha256}


def load_downstream(paths: Sequence[str | Path], output_dir: str | Path) -> list[Downstream]:
    """The downstream corpora to exclude, sorted by path and deduplicated. ValueError naming the
    folder when one is not a built corpus, or is the corpus being built."""
    out = Path(output_dir).expanduser().resolve()
    found: dict[str, Downstream] = {}
    for p in paths:
        path = Path(p).expanduser().resolve()
        if path == out:
            raise ValueError(f"exclude_overlap_with {path}: that is the corpus being built; name the downstream "
                             "corpus whose val/test records it must not hold")
        try:
            corpus = open_corpus(path)              # its manifest read once, for the fingerprints too
        except CorpusError as e:
            raise ValueError(f"exclude_overlap_with {path}: not a built corpus ({e}); build it first with "
                             "jobs/preprocess.py, then exclude its val/test records") from None
        table = only_splits(corpus_fingerprints(corpus), GUARDED_SPLITS)
        found[str(path)] = Downstream(str(path), records_sha256(table), table, corpus.manifest.get("preprocess") or {},
                                      corpus.manifest.get("patient_ids"))
    return [found[k] for k in sorted(found)]


def records_sha256(table: pa.Table) -> str:
    """sha256 of a downstream corpus's val/test fingerprint rows in a fixed order: the records the
    exclusion removes, unchanged by a rebuild of the same records (its manifest, which names the
    code version and build time, is not)."""
    cols = [c for c in ("dataset", "record_id", "patient_id", "window_index", "split", "keys", "features")
            if c in table.column_names]
    t = table.select(cols).sort_by([(c, "ascending") for c in cols if c in ("split", "record_id", "window_index")])
    h = hashlib.sha256()
    for c in cols:
        for chunk in t.column(c).chunks:
            for buf in chunk.buffers():
                if buf is not None:
                    h.update(buf)
    return h.hexdigest()


def identities(downstream: Iterable[Downstream]) -> list[dict[str, str]]:
    """[{path, records_sha256}]: what the shard keys and the manifest hold of the exclusion."""
    return [d.identity for d in downstream]


def check_finished(out: Path, downstream: Sequence[Downstream]) -> None:
    """ValueError naming the folder and the difference when a finished corpus at `out` was built
    with other exclusions than asked now (none counts): resuming would mix two record sets (its
    shards were filtered against other downstream corpora, or not at all)."""
    f = out / MANIFEST
    if not f.is_file():
        return
    before = [{"path": d["path"], "records_sha256": d.get("records_sha256", "")}
              for d in (json.loads(f.read_text()).get(MANIFEST_KEY) or {}).get("downstream", [])]
    now = identities(downstream)
    if before == now:
        return

    def describe(ids: list[dict[str, str]]) -> str:
        named = ", ".join(f"{d['path']} (val/test records sha256 {d['records_sha256'][:12]})" for d in ids)
        return named or "no downstream corpus"

    shas = {d["path"]: d["records_sha256"] for d in before}
    changed = sorted(d["path"] for d in now if d["path"] in shas and shas[d["path"]] != d["records_sha256"])
    rebuilt = f" (rebuilt since: {', '.join(changed)})" if changed else ""
    raise ValueError(f"{out}: a finished corpus built excluding the val/test records of {describe(before)}, asked "
                     f"now to exclude those of {describe(now)}{rebuilt}. Its shards hold another record set; "
                     "build into a new folder (or delete this one) to change the exclusion")


def patient_id_warnings(downstream: Sequence[Downstream], patient_ids: dict[str, Any] | None,
                        dataset: str) -> list[str]:
    """Downstream corpora of the same dataset (patients match within one) whose patient keys cannot
    match this corpus's (another salt, or ids as read against salted ones): the exclusion then
    finds their patients by recording only."""
    return [f"exclude_overlap_with {d.path}: {w}" for d in downstream
            if dataset in set(d.fingerprints.column("dataset").unique().to_pylist())
            and (w := comparable_warning(patient_ids, d.patient_ids))]


def preprocess_warnings(downstream: Sequence[Downstream], preprocess: dict[str, Any]) -> list[str]:
    """Downstream corpora preprocessed otherwise than the corpus being built: a recording in both
    is stored as other numbers, so its fingerprints may not match (the exclusion may miss it)."""
    ours = json.loads(json.dumps(preprocess, sort_keys=True, default=str))
    out = []
    for d in downstream:
        keys = sorted(set(ours) | set(d.preprocess))
        diff = ", ".join(f"{k}: {ours.get(k)} here vs {d.preprocess.get(k)}" for k in keys
                         if ours.get(k) != d.preprocess.get(k))
        if diff:
            out.append(f"exclude_overlap_with {d.path}: preprocessed differently ({diff}); its recordings may "
                       "not be found by signal here (patient ids still compare)")
    return out


def excluded_records(table: pa.Table, shape: Sequence[int], dtype: str,
                     downstream: Sequence[Downstream]) -> dict[str, Excluded]:
    """{record id: Excluded} for the records of a shard's windows table (coreecg.data.corpus
    schema) that share a patient or a recording with a downstream corpus's val/test records, found
    by the leakage guard's `compare` on fingerprints of the windows as stored."""
    if not downstream or table.num_rows == 0:
        return {}
    keys, features = window_fingerprints(signal_view(table.column("signal"), tuple(shape), dtype))
    ours = fingerprint_table(table, keys, features)
    pairs = []
    for d in downstream:       # a record of ours is A (any split), the downstream's val/test B
        overlap = compare(ours, d.fingerprints, "this corpus", d.path, splits=GUARDED_SPLITS)
        if len(overlap.pairs):
            pairs.append(overlap.pairs.assign(downstream=d.path))
    if not pairs:
        return {}
    return {str(rid): Excluded(reason(group), tuple(sorted(set(group["downstream"]))))
            for rid, group in pd.concat(pairs, ignore_index=True).groupby("a_record")}


def reason(pairs: pd.DataFrame) -> str:
    """The quarantine reason of one excluded record from its guard pairs: its first twin (a shared
    recording before a shared patient), and how many more matches there are."""
    pairs = pairs.assign(order=(pairs["kind"] != "signal").astype(int)).sort_values(
        ["order", "downstream", "b_split", "b_record"])
    first = pairs.iloc[0]
    more = len(pairs.drop_duplicates(["downstream", "b_record"])) - 1
    if first["kind"] == "signal":
        what, detail = "a recording", f"similarity {first['similarity']:g}"
    else:
        what, detail = "a patient", f"patient {first['a_patient']}"
    extra = f", {more} more match(es)" if more else ""
    # the kind before " (" names no record, so the manifest's quarantine summary stays one line
    # per downstream corpus (coreecg.data.pipeline.reason_kind); the twin goes in the parenthesis
    return (f"shares {what} with a val/test record of {Path(first['downstream']).name} ({first['downstream']} "
            f"{first['b_split']} record {first['b_record']}; {detail}{extra}; {REASON_TAIL})")


def manifest_entry(downstream: Sequence[Downstream], markers: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The manifest's record of the exclusion (None when nothing was asked): the downstream corpora
    (path, sha256 of their val/test records), the splits excluded, the records and windows removed (each record is
    in quarantine.csv with its reason)."""
    if not downstream:
        return None
    removed = [e for m in markers for e in m.get("excluded", [])]
    return {"downstream": identities(downstream), "splits": list(GUARDED_SPLITS),
            "records_removed": len(removed), "windows_removed": sum(e["windows"] for e in removed),
            "by_downstream": {d.path: sum(d.path in e["downstream"] for e in removed) for d in downstream}}
