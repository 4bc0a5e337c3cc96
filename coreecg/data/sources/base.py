"""The contract every source reader meets, and the small helpers they share.

A source turns a folder of one public database into `RecordRef`s (cheap: index files
and directory listings only, no signal reads) and then one ref into a `Record`.
Anything that makes a record unusable is a `RecordError(path, reason)`, raised by
`read`, so the pipeline can quarantine it with that reason instead of dropping it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

from coreecg.data.record import Record, RecordError, RecordRef
from coreecg.data.sources.wfdb_io import header_data_files


@runtime_checkable
class Source(Protocol):
    """One public ECG database, as a reader.

    name: registry name ("ptbxl", "cpsc2018", "cinc2021", "mimic-iv-ecg", "code15", "wfdb", "synthetic").
    class_names: the fixed class order of this source's label space (empty if unlabelled).
    multilabel: whether a record may carry more than one class.
    """

    name: str
    class_names: tuple[str, ...]
    multilabel: bool

    def list_records(self, root: Path) -> list[RecordRef]:
        """Sorted, deterministic refs. FileNotFoundError if `root` is missing,
        ValueError if it holds no records of this source."""
        ...

    def read(self, ref: RecordRef) -> Record:
        """The record behind `ref`, or RecordError(path, reason)."""
        ...


def require_root(root: Path | str) -> Path:
    """`root` as a Path; FileNotFoundError naming it if it is not a directory."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"data root not found (or not a directory): {root}")
    return root


def no_records(source: str, root: Path, what: str) -> ValueError:
    """The error for a folder that exists but holds nothing this source can list."""
    return ValueError(f"{source}: no records under {root} ({what})")


def walk(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """(folder, sorted file names) for `root` and every folder below it, in sorted order.

    One pass over the tree for what several listings need (headers, data files, index files).
    """
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        yield Path(folder), sorted(files)


DATA_SUFFIXES = (".dat", ".mat")
# Reason of a data file listed without a header; `read` raises it (the pipeline quarantines it).
_LISTING_ERROR = "listing_error"


def orphan_data_files(folder: Path, files: list[str], candidates: list[str] | None = None) -> list[Path]:
    """WFDB data files in `folder` (`.dat`/`.mat`, or only `candidates`) that no header names.

    A data file belongs to the header of the same stem, or to any header of the folder whose
    signal lines name it (a record may keep its samples under another name). Only folders with
    a data file whose stem has no header pay for reading the headers' text.
    """
    stems = {f[:-4] for f in files if f.endswith(".hea")}
    names = candidates if candidates is not None else [f for f in files if f.endswith(DATA_SUFFIXES)]
    lonely = [f for f in names if Path(f).stem not in stems]
    if not lonely:
        return []
    named = set().union(*(header_data_files(folder / f"{s}.hea") for s in stems)) if stems else set()
    return [folder / f for f in lonely if f not in named]


def no_header_ref(source: str, record_id: str, data_file: Path, **extra) -> RecordRef:
    """A ref for a data file without a header: listed, so that `read` quarantines it by name.

    Its record id should keep the file's suffix ("A0001.mat"), so that it cannot clash with
    (and be reported as a duplicate of) a record of the same stem.
    """
    reason = f"no header: {data_file.name} has no {data_file.stem}.hea and no header beside it names it"
    return RecordRef(source, record_id, str(data_file), {**extra, _LISTING_ERROR: reason})


def raise_listing_error(ref: RecordRef) -> None:
    """RecordError for refs that listing found unusable (e.g. `no_header_ref`); else nothing."""
    reason = ref.extra.get(_LISTING_ERROR)
    if reason:
        raise RecordError(ref.path, reason)


def split_codes(text: str, sep: str = ",") -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c'] (header and csv label cells)."""
    return [t.strip() for t in str(text).split(sep) if t.strip()]


def as_age(value) -> float | None:
    """Header/csv age cell -> years, or None for missing/unknown ('NaN', 'Unknown', '')."""
    try:
        age = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return age if age == age else None  # NaN -> None


def map_labels(tokens: list[str], token_to_class: dict[str, str],
               class_names: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """Mapped class names (deduplicated, in `class_names` order) and the unmapped tokens.

    Several tokens may map to one class (equivalent codes); order follows the source's
    class order so equal label sets compare equal as tuples.
    """
    hit = {token_to_class[t] for t in tokens if t in token_to_class}
    unmapped = [t for t in tokens if t not in token_to_class]
    return tuple(c for c in class_names if c in hit), unmapped


def require_task_label(path: str, labels: tuple[str, ...], class_names: tuple[str, ...], codes: list[str],
                       unrecognised: list[str], what: str = "diagnosis codes", hint: str = "") -> None:
    """RecordError "no label of the task" when a labelled source's record has none of its classes.

    In a corpus with a task (class names), such a record would be stored with no label (-1)
    and read as a negative for every class; unlabelled views (no class names) keep it.
    """
    if class_names and not labels:
        raise RecordError(path, f"no label of the task: {what} [{', '.join(codes)}] map to none of "
                                f"the {len(class_names)} classes" + (f" ({hint})" if hint else ""),
                          unrecognised_codes=unrecognised)


__all__ = ["Source", "Record", "RecordRef", "RecordError", "require_root", "no_records", "walk",
           "orphan_data_files", "no_header_ref", "raise_listing_error", "split_codes", "map_labels",
           "require_task_label", "as_age"]
