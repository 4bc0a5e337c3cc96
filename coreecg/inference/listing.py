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
from coreecg.data.sources import get_source, label_free_options, reader_options
from coreecg.data.sources.base import DATA_SUFFIXES, no_header_ref, walk
from coreecg.data.sources.exports import iter_files, sniff
from coreecg.data.sources.wfdb_generic import WfdbFolderSource, known_layout
from coreecg.inference.items import CorpusShard, Failure, InputRecord
from coreecg.data.reading import splits_of


def source_options(config: Config | None = None) -> dict[str, dict[str, Any]]:
    """Reader options for the databases listed by their own reader: label-free views (inference
    needs no labels, and a labelled view refuses records outside its task), the config's rate."""
    options = label_free_options(config)
    if config is not None:     # each format reader's own section applies to its files (edf.unnamed_lead, ...)
        options["auto"] = {**reader_options("auto", config.data), **options["auto"]}
    return options


def list_inputs(paths: Iterable[str | Path], config: Config | None = None,
                options: dict[str, dict[str, Any]] | None = None, splits: Sequence[str] | None = None
                ) -> tuple[list[InputRecord | CorpusShard], list[Failure]]:
    """Files and folders -> (records in order, inputs that gave none), each path listed once.

    A coreecg corpus folder (manifest.json): its shard files of `splits` (default: every split,
    train/val/test order), each a CorpusShard.

    A folder: a known database layout (its index file, at the folder or below it) through its own
    reader; everything else below it through the generic WFDB reader, with record ids relative to
    the folder; hospital exports below it (DICOM, GE MUSE XML, HL7 aECG, EDF, by content) through
    their own readers. A file: a WFDB record by its `.hea`, `.dat` or `.mat` (a data file without
    header is listed and fails with "no header"), a hospital export, or a known index file (its
    folder is read). A missing
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
                    raise ValueError(f"no records under {path} (no .hea or {'/'.join(DATA_SUFFIXES)} files, "
                                     "no DICOM, MUSE XML, HL7 aECG or EDF file)")
                items += found
            elif path.is_file() and known_layout(path) is not None:
                items += _list_folder(path.parent, options)     # an index file: its database
            elif path.is_file():
                items.append(_file_record(path, options=options))
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
    manifest = load_manifest(corpus)
    sig = manifest["signal"]
    shape = tuple(int(n) for n in sig["shape"])
    settings = tuple(sorted(manifest["preprocess"].items()))
    return [CorpusShard(str(f), split, shape, tuple(sig["leads"]), settings)
            for split in (splits or splits_of(corpus, manifest)) for f in split_files(corpus, split, manifest)]


# Formats of one recording per file that inference lists by content (sniff), besides WFDB: the
# hospital exports. A file named on the command line that is XML of another kind is listed too
# (it fails with what it is); in a folder, such files (settings, reports) are left alone.
EXPORT_FORMATS = ("dicom", "muse", "aecg", "edf")


def _exports(folder: Path, root: Path, options: dict[str, dict[str, Any]], below: bool = True) -> list[InputRecord]:
    """The hospital export files in `folder` (and below it) (DICOM, MUSE, aECG, EDF: by content,
    any suffix), each through the reader its content asks for (`--source auto`'s), ids relative to `root`."""
    auto = get_source("auto", **options.get("auto", {}))
    out = []
    files = iter_files(folder) if below else sorted(f for f in folder.iterdir() if f.is_file() and f.name[0] != ".")
    for path in files:
        if path.suffix.lower() == ".hea" or path.suffix.lower() in DATA_SUFFIXES:
            continue
        fmt = sniff(path)
        if fmt in EXPORT_FORMATS:
            out += [InputRecord(r, auto) for r in auto.file_refs(path, path.relative_to(root).as_posix(), fmt)]
    return out


def _list_folder(root: Path, options: dict[str, dict[str, Any]]) -> list[InputRecord]:
    """A folder's records: known layouts by their reader, hospital exports by theirs, the rest by
    the generic WFDB one."""
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
                refs = []
            prefix = folder.relative_to(root)
            return ([InputRecord(dataclasses.replace(r, record_id=str(prefix / r.record_id)), generic) for r in refs]
                    + _exports(folder, root, options))
        # A layout lies deeper: this folder's own headers one by one, then each subfolder.
        out = [_file_record(f, record_id=str(f.relative_to(root).with_suffix("")))
               for f in sorted(folder.glob("*.hea"))]
        out += _exports(folder, root, options, below=False)
        for sub in sorted(d for d in folder.iterdir() if d.is_dir()):
            out += visit(sub)
        return out

    return visit(root)


def _file_record(path: Path, record_id: str | None = None,
                 options: dict[str, dict[str, Any]] | None = None) -> InputRecord:
    """One file given by name -> its record (ValueError for a file that names none): a WFDB
    record by its header or data file, a hospital export (DICOM, MUSE, aECG, EDF) by its content."""
    generic = WfdbFolderSource()
    suffix = path.suffix.lower()
    fmt = sniff(path) if suffix != ".hea" and suffix not in DATA_SUFFIXES else None
    if fmt in (*EXPORT_FORMATS, "xml"):
        auto = get_source("auto", **(options or {}).get("auto", {}))
        return InputRecord(auto.file_refs(path, record_id or path.name, fmt)[0], auto)
    if suffix == ".hea" or (suffix in DATA_SUFFIXES and path.with_suffix(".hea").is_file()):
        stem = path.with_suffix("")
        return InputRecord(RecordRef(generic.name, record_id or stem.name, str(stem), {}), generic)
    if suffix in DATA_SUFFIXES:                # read() fails it with the reader's "no header" reason
        return InputRecord(no_header_ref(generic.name, record_id or path.name, path), generic)
    raise ValueError(f"not a WFDB record (.hea, {', '.join(DATA_SUFFIXES)}), a DICOM, MUSE XML, HL7 aECG or EDF "
                     "file, or a folder")
