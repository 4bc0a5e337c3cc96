"""The record types every source reader produces and every later stage consumes.

A source is enumerated cheaply into `RecordRef`s (paths plus whatever the index files
already say), so that reading, filtering and writing can be fanned out over Ray Data
workers one ref at a time. `read(ref)` returns a `Record` or raises `RecordError`
with a reason; the pipeline turns that into a quarantine row, never a silent drop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from coreecg.config import STANDARD_LEADS  # noqa: F401  (re-exported: the canonical lead order)


class RecordError(Exception):
    """A record that cannot be used; `reason` is a short, stable, human-readable cause.

    `unrecognised_codes`: diagnosis codes the reader did not know, for a record refused
    because of its labels (the manifest counts them per code, written records or not).
    """

    def __init__(self, path: str, reason: str, unrecognised_codes: Sequence[str] = ()):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.unrecognised_codes = list(unrecognised_codes)


@dataclass(frozen=True)
class RecordRef:
    """Where a record lives and what the source's index already knows about it.

    `extra` must stay JSON-serialisable (it travels through Ray Data rows).
    """

    source: str
    record_id: str
    path: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Record:
    """One raw recording, as read from disk.

    signal: (n_leads, n_samples) float32, millivolts, in the file's own lead order.
    lead_names: one name per row of `signal`, as the file spells it.
    labels: class names in the source's label space (empty for unlabelled corpora).
    """

    source: str
    record_id: str
    signal: np.ndarray
    fs: float
    lead_names: tuple[str, ...]
    patient_id: str | None
    labels: tuple[str, ...]
    path: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.signal.shape[1] / self.fs
