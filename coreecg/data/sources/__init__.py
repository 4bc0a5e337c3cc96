"""Source readers: one per public ECG database, all meeting `Source` (see base.py), each one
module that registers itself with `register_source` (registry.py): its reader, options section,
index file, label-free view and dataset key.

    src = get_source("ptbxl", label_view="multi", rate=100)
    refs = src.list_records(Path("../shared/ecg-data/ptbxl"))
    rec = src.read(refs[0])          # Record, or RecordError(path, reason)

A source of your own is one module named in the config's `plugins` (docs/data_sources.md,
"Adding a source"). The readers' own dependencies (h5py, scipy.io, pandas) load only where a
reader runs.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from coreecg.data.sources.base import Source
from coreecg.data.sources.registry import (
    PAPER_DATASETS, SOURCES, IndexFile, SourceSpec, dataset_aliases, dataset_key, dataset_label, dataset_labels,
    label_free_options, layout_source, reader_options, register_source, source_spec, source_specs,
)
# The built-in readers register themselves (registry order: the order listed here).
from coreecg.data.sources import ptbxl, cpsc2018, cinc2021, mimic, code15, wfdb_generic, synthetic  # noqa: F401
# Hospital and device exports (exports.py), then `auto`, which reads a mixed folder with them.
from coreecg.data.sources import dicom, muse, aecg, edf, arrays, auto  # noqa: F401
from coreecg.data.tasks import TaskSource, csv_column_values, split_task_options


def get_source(name: str, **options) -> Source:
    """A source reader by registry name; unknown names raise ValueError listing the known ones.

    `task=<a registered task>` (coreecg.data.tasks) builds the reader's label-free view wrapped in a
    `TaskSource`, whose records carry the task's target."""
    spec = source_spec(name)
    label_free = spec.label_free
    if callable(label_free) and "task" in options:     # a function of the options section's values
        defaults = dataclasses.asdict(spec.options()) if spec.options is not None else {}
        label_free = label_free(SimpleNamespace(**{**defaults, **options}))
    if label_free is None:
        label_free = getattr(spec.cls, "unlabelled_view", None)
    if "task" not in options:
        return spec.cls(**options)
    task, reader_opts = split_task_options(spec.cls, options, None if label_free is None else dict(label_free))
    reader = spec.cls(**reader_opts)
    if task is None:
        return reader
    column = csv_column_values(options["labels"], task.column) if task.column else None
    return TaskSource(reader, task, column)


__all__ = ["SOURCES", "PAPER_DATASETS", "IndexFile", "Source", "SourceSpec", "get_source", "register_source",
           "source_spec", "source_specs", "reader_options", "layout_source", "label_free_options", "dataset_key",
           "dataset_label", "dataset_labels", "dataset_aliases"]
