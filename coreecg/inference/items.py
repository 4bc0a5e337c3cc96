"""What inference passes around: a listed input (a file's record, a corpus shard), a failure with
its reason, the per-record result, and the error for a model or setting it cannot work with."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coreecg.data.record import Record, RecordRef
from coreecg.data.sources.base import Source


class InferenceError(ValueError):
    """A model or a setting inference cannot work with (named; nothing was predicted)."""


@dataclass(frozen=True)
class InputRecord:
    """One listed recording: its ref and the reader that reads it."""

    ref: RecordRef
    source: Source

    @property
    def record_id(self) -> str:
        return self.ref.record_id


@dataclass(frozen=True)
class CorpusShard:
    """One shard file of a coreecg corpus: its records' stored windows (already preprocessed and
    float16), scored as they are. shape (leads, samples), leads: the manifest's "signal";
    preprocess: its "preprocess" settings as (key, value) pairs."""

    path: str
    split: str
    shape: tuple[int, int]
    leads: tuple[str, ...]
    preprocess: tuple[tuple[str, Any], ...]


Item = InputRecord | CorpusShard | Record     # what run_inference scores (a Record: in memory)


@dataclass(frozen=True)
class Failure:
    """A record (or an input path) that gave no prediction, and why."""

    record_id: str
    path: str
    reason: str


@dataclass
class InferenceResult:
    """Per-record outputs, in listing order (failed records left out).

    record_id, path: (m,) each; probs: (m, K) float64 class probabilities (classifier, else None);
    embeddings: (m, D) float32 pooled embeddings (an encoder, or asked for, else None);
    windows: (m,) windows per record; class_names: K names; failures: what gave no output
    (listing failures first, then records in item order). item: (m,) the index in the scored
    items of each record's item (a corpus shard gives many records; an item that gives none gave
    exactly one Failure).
    """

    record_id: list[str]
    path: list[str]
    probs: np.ndarray | None
    embeddings: np.ndarray | None
    windows: np.ndarray
    class_names: tuple[str, ...]
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    item: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    precision: str = "fp32"             # the path that scored (coreecg.inference.precision)
    regression: bool = False            # probs are a regression task's values in its unit (coreecg.data.tasks)
    precision_reason: str = ""          # why: auto's choice, a fallback, "asked for"
    compiled: bool = False              # the feature pass ran compiled (coreecg.inference.compiled)
    compile_reason: str = ""            # why (not): inference.compile's choice, a compiler failure
