"""The contract every source reader meets, and the small helpers they share.

A source turns a folder of one public database into `RecordRef`s (cheap: index files
and directory listings only, no signal reads) and then one ref into a `Record`.
Anything that makes a record unusable is a `RecordError(path, reason)`, raised by
`read`, so the pipeline can quarantine it with that reason instead of dropping it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from coreecg.data.record import Record, RecordError, RecordRef


@runtime_checkable
class Source(Protocol):
    """One public ECG database, as a reader.

    name: registry name ("ptbxl", "cpsc2018", "cinc2021", "mimic-iv-ecg", "wfdb", "synthetic").
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


__all__ = ["Source", "Record", "RecordRef", "RecordError", "require_root", "no_records",
           "split_codes", "map_labels", "as_age"]
