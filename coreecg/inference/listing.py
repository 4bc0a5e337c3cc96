"""Listing inputs: files and folders -> the records to score (a known database through its own
reader in its label-free view, any other folder through the generic WFDB reader, a file as one
WFDB record, a coreecg corpus as its shard files), and the inputs that gave none."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Sequence

from coreecg.config import Config
from coreecg.data.corpus import load_manifest, split_files
from coreecg.data.record import RecordRef
from coreecg.data.sources import get_source, label_free_options
from coreecg.data.sources.base import DATA_SUFFIXES, no_header_ref, walk
from coreecg.data.sources.wfdb_generic import WfdbFolderSource, known_layout
from coreecg.inference.items import CorpusShard, Failure, InputRecord


def source_options(config: Config | None = None) -> dict[str, dict[str, Any]]:
    """Reader options for the databases listed by their own reader: label-free views (inference
    needs no labels, and a labelled view refuses records outside its task), the config's rate."""
    return label_free_options(config)


def list_inputs(paths: Iterable[str | Path], config: Config | None = None,
                options: dict[str, dict[str, Any]] | None = None, splits: Sequence[str] | None = None
                ) -> tuple[list[InputRecord | CorpusShard], list[Failure]]:
    """Files and folders -> (records in order, inputs that gave none), each path listed once.

    A coreecg corpus folder (manifest.json): its shard files of `splits` (default: every split,
    train/val/test order), each a CorpusShard.

    A folder: a known database layout (its index file, at the folder or below it) through its own
    reader; everything else below it through the generic WFDB reader, with record ids relative to
    the folder. A file: a WFDB record by its `.hea`, `.dat` or `.mat` (a data file without header
    is listed and fails with "no header"), or a known index file (its folder is read). A missing
    path or a folder with no record is a Failure.
    """
    options = options if options is not None else source_options(config)
    items: list[InputRecord] = []
    failures: list[Failure] = []
    for p in paths:
        path = Path(p).expanduser()
        try:
            if path.is_dir() and (path / "manifest.json").is_file():
                items += list_corpus(path, splits)
            elif path.is_dir():
                found = _list_folder(path, options)
                if not found:
                    raise ValueError(f"no records under {path} (no .hea or {'/'.join(DATA_SUFFIXES)} files)")
                items += found
            elif path.is_file() and known_layout(path) is not None:
                items += _list_folder(path.parent, options)     # an index file: its database
            elif path.is_file():
                items.append(_file_record(path))
            else:
                failures.append(Failure(str(p), str(p), "no such file or folder"))
        except (ValueError, OSError) as e:      # a listing error of a reader: the whole input
            failures.append(Failure(str(p), str(p), f"cannot list: {e}"))
    seen: set[str] = set()
    unique = []
    for it in items:                           # a record given twice (its folder and itself): the first
        key = str(Path(it.path if isinstance(it, CorpusShard) else it.ref.path).resolve())
        if key not in seen:
            seen.add(key)
            unique.append(it)
    return unique, failures


def list_corpus(corpus: str | Path, splits: Sequence[str] | None = None) -> list[CorpusShard]:
    """A corpus folder's shard files of `splits` (default all) in manifest order (CorpusError, a
    ValueError naming the folder, for a corpus that is unfinished or lacks a split)."""
    from coreecg.data.reading import splits_of

    manifest = load_manifest(corpus)
    sig = manifest["signal"]
    shape = tuple(int(n) for n in sig["shape"])
    settings = tuple(sorted(manifest["preprocess"].items()))
    return [CorpusShard(str(f), split, shape, tuple(sig["leads"]), settings)
            for split in (splits or splits_of(corpus, manifest)) for f in split_files(corpus, split, manifest)]


def _list_folder(root: Path, options: dict[str, dict[str, Any]]) -> list[InputRecord]:
    """A folder's records: known layouts by their reader, the rest by the generic one."""
    layouts = {folder: name for folder, files in walk(root) for f in files
               if (name := known_layout(folder / f)) is not None}
    generic = WfdbFolderSource()

    def visit(folder: Path) -> list[InputRecord]:
        if folder in layouts:
            src = get_source(layouts[folder], **options.get(layouts[folder], {}))
            return [InputRecord(r, src) for r in src.list_records(folder)]
        if not any(folder in d.parents for d in layouts):
            try:
                refs = generic.list_records(folder)
            except ValueError:                 # a folder of other files (csv tables, .h5) inside a tree
                return []
            prefix = folder.relative_to(root)
            return [InputRecord(dataclasses.replace(r, record_id=str(prefix / r.record_id)), generic) for r in refs]
        # A layout lies deeper: this folder's own headers one by one, then each subfolder.
        out = [_file_record(f, record_id=str(f.relative_to(root).with_suffix("")))
               for f in sorted(folder.glob("*.hea"))]
        for sub in sorted(d for d in folder.iterdir() if d.is_dir()):
            out += visit(sub)
        return out

    return visit(root)


def _file_record(path: Path, record_id: str | None = None) -> InputRecord:
    """One file given by name -> its record (ValueError for a file that names none)."""
    generic = WfdbFolderSource()
    suffix = path.suffix.lower()
    if suffix == ".hea" or (suffix in DATA_SUFFIXES and path.with_suffix(".hea").is_file()):
        stem = path.with_suffix("")
        return InputRecord(RecordRef(generic.name, record_id or stem.name, str(stem), {}), generic)
    if suffix in DATA_SUFFIXES:                # read() fails it with the reader's "no header" reason
        return InputRecord(no_header_ref(generic.name, record_id or path.name, path), generic)
    raise ValueError(f"not a WFDB record (.hea, {', '.join(DATA_SUFFIXES)}) or a folder")
