"""The leakage guard before a fine-tuning (and a study): the encoder's pretraining corpus against
the downstream corpus's val and test splits (`coreecg.data.overlap`, docs/leakage.md).

Where the pretraining corpus's fingerprints come from, first found wins:

    the copy an export carries    PRETRAINING_FINGERPRINTS, its sha256 in config.json's provenance
    the corpus itself             data.corpus of the encoder's run config (its fingerprints.parquet,
                                  computed and cached on first use)

An encoder pretrained on the embedded synthetic corpus (data.corpus empty) holds no real record:
nothing to check. A corpus that is neither here nor carried is a LeakageError (the check cannot
run), unless finetune.allow_overlap, which records that the run went unchecked.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from coreecg.checkpoints import CheckpointError
from coreecg.data.corpus import MANIFEST, OpenCorpus
from coreecg.data.declared import declared_overlap
from coreecg.data.fingerprints import FINGERPRINT_FILE, corpus_fingerprints, read_fingerprint_file
from coreecg.data.overlap import (
    EXAMPLES, GUARDED_SPLITS, OVERLAP_CSV, PRETRAINED_SPLITS, LeakageError, Overlap, compare,
)
from coreecg.files import sha256_file
from coreecg.loading import ModelSource, open_source
from coreecg.model.published import family

PRETRAINING_FINGERPRINTS = "pretraining_fingerprints.parquet"   # the copy an export carries
ALLOW = "pass --allow-overlap (finetune.allow_overlap=true)"


@dataclass(frozen=True)
class Pretraining:
    """An encoder's pretraining data: the corpus path as recorded (None: the synthetic corpus or
    no pretraining), the fingerprint file that travels with it and its sha256, and why none."""

    corpus: str | None
    carried: Path | None = None
    sha256: str | None = None
    note: str = ""
    mixture: tuple[str, ...] = ()       # a mixture's corpora (`corpus` then names them, joined by " + ")
    declared: tuple[str, ...] = ()      # a published family's declared pretraining databases
    family: str = ""                    # ... and its title

    @property
    def recorded(self) -> str | list[str] | None:
        """What metrics.json's "pretraining_corpus" says: the path, or a mixture's paths."""
        return list(self.mixture) if self.mixture else self.corpus


def _of_paths(paths: Any, carried: Path | None = None, sha256: str | None = None, note: str = "") -> Pretraining:
    """A recorded pretraining corpus: one path, or a mixture's list of them."""
    if isinstance(paths, (list, tuple)) and len(paths) > 1:
        paths = tuple(str(Path(p).expanduser().resolve()) for p in paths)
        return Pretraining(" + ".join(paths), carried, sha256, note, mixture=paths)
    if isinstance(paths, (list, tuple)):
        paths = paths[0] if paths else None
    return Pretraining(str(Path(paths).expanduser().resolve()) if paths else None, carried, sha256, note)


def pretraining_of(src: ModelSource) -> Pretraining:
    """The pretraining data of a model source opened as an encoder (coreecg.loading.open_source)."""
    if src.entries.get("published"):   # another project's weights (also exported or fine-tuned): not here
        fam = family(src.entries["published"])
        return Pretraining(None, note=f"published {fam.title} weights: {fam.pretraining}",
                           declared=tuple(fam.pretrained_on), family=fam.title)
    if src.export is not None:
        corpus = (((src.export.get("provenance") or {}).get("pretraining") or {}).get("corpus")) or {}
        fp = corpus.get("fingerprints") or {}
        carried = src.path / fp["file"] if fp.get("file") else None
        path = corpus.get("path")
        if isinstance(path, (list, tuple)):          # a mixture's corpora
            return _of_paths(path, carried, fp.get("sha256"))
        return Pretraining(path, carried, fp.get("sha256"),
                           "" if path else "pretrained on the embedded synthetic corpus")
    cfg = src.config
    if src.entries.get("task") == "finetune":       # a fine-tuned classifier's encoder: its own pretraining
        if cfg.finetune.mode == "scratch" or not cfg.finetune.encoder:
            return Pretraining(None, note="its encoder was trained from scratch: no pretraining corpus")
        if cfg.finetune.encoder == "random":     # finetune.encoder=random: no pretraining either
            return Pretraining(None, note="its encoder was randomly initialised: no pretraining corpus")
        try:
            return pretraining_of(open_source(cfg.finetune.encoder, kind="encoder"))
        except CheckpointError:
            return Pretraining(None, note=f"its encoder ({cfg.finetune.encoder}) is not here: pretraining unknown")
    if not cfg.data.corpus:
        return Pretraining(None, note="pretrained on the embedded synthetic corpus: no real record")
    return _of_paths(cfg.data.corpora)


def fingerprints_of(pre: Pretraining) -> tuple[pa.Table, str]:
    """(the pretraining corpus's fingerprints, the file they came from); LeakageError when
    neither a carried copy nor the corpus is here, or the copy fails its sha256."""
    if pre.carried is not None and pre.carried.is_file():
        if pre.sha256 and sha256_file(pre.carried) != pre.sha256:
            raise LeakageError(f"{pre.carried}: corrupted fingerprint file (sha256 differs from the one its "
                               "export's config.json records); export the encoder again")
        return read_fingerprint_file(pre.carried), str(pre.carried)
    if pre.mixture:                               # every corpus of the mixture, as one table
        parts = [fingerprints_of(Pretraining(c)) for c in pre.mixture]
        meta = parts[0][0].schema.metadata
        table = pa.concat_tables([t.replace_schema_metadata(meta) for t, _ in parts])
        return table, " + ".join(where for _, where in parts)
    path = Path(pre.corpus).expanduser()
    if not (path / MANIFEST).is_file():
        raise LeakageError(f"{path}: the encoder's pretraining corpus is not here and no fingerprint file travels "
                           f"with the encoder, so the leakage guard cannot compare it with the downstream corpus; "
                           f"fine-tune from an export made where the corpus is (it carries "
                           f"{PRETRAINING_FINGERPRINTS}), or {ALLOW} to proceed unchecked")
    return corpus_fingerprints(path), str(path / FINGERPRINT_FILE)


def check_overlap(pre: Pretraining, downstream: Path | OpenCorpus,
                  allow: bool) -> tuple[dict[str, Any], Overlap | None]:
    """-> (metrics.json's "leakage" entry, the overlap when there is one). LeakageError naming the
    records when the pretraining corpus shares records or patients with the downstream val/test
    splits, or cannot be checked, unless `allow`. downstream: a path, or the planner's opened
    corpus (its manifest is then not read again)."""
    if pre.corpus is None and pre.carried is None:
        entry = {"checked": False, "allowed": allow, "overlap": False, "reason": pre.note}
        if pre.declared:                 # the family's own declaration, held against the downstream database
            manifest = downstream.manifest if isinstance(downstream, OpenCorpus) else \
                json.loads((Path(downstream) / MANIFEST).read_text())
            entry["declared"] = {"family": pre.family, "pretrained_on": list(pre.declared),
                                 "databases": declared_overlap(pre.declared, manifest)}
        return entry, None
    t0 = time.perf_counter()
    try:
        table, where = fingerprints_of(pre)
    except LeakageError as e:
        if not allow:
            raise
        return {"checked": False, "allowed": True, "overlap": None, "pretraining_corpus": pre.recorded,
                "reason": str(e)}, None
    overlap = compare(table, corpus_fingerprints(downstream), pre.corpus or where, str(downstream),
                      splits=GUARDED_SPLITS, a_splits=PRETRAINED_SPLITS)
    found = overlap.counts["b_records"] > 0
    if found and not allow:
        raise LeakageError(f"{overlap.message()}; fine-tuning would measure records the encoder was pretrained "
                           f"on. Use a downstream corpus without them, or {ALLOW} to fine-tune anyway (the "
                           "overlap is recorded in metrics.json, overlap.csv and the report)")
    entry = {"checked": True, "allowed": allow, "overlap": found, "pretraining_corpus": pre.recorded,
             "fingerprints": where, "splits": list(GUARDED_SPLITS), **overlap.counts,
             "examples": overlap.b_record_ids[:EXAMPLES], "file": OVERLAP_CSV if found else None,
             "seconds": round(time.perf_counter() - t0, 3)}
    return entry, overlap if found else None
