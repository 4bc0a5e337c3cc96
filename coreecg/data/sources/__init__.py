"""Source readers: one per public ECG database, all meeting `Source` (see base.py).

    src = get_source("ptbxl", label_view="multi", rate=100)
    refs = src.list_records(Path("../shared/ecg-data/ptbxl"))
    rec = src.read(refs[0])          # Record, or RecordError(path, reason)

Readers are imported on first use so that importing this package stays cheap and a
reader's dependencies (h5py, scipy.io) load only where that reader runs.
"""
from __future__ import annotations

import importlib

from coreecg.data.sources.base import Source

# name -> "module:Class"; options passed to get_source go to the class constructor.
SOURCES: dict[str, str] = {
    "ptbxl": "coreecg.data.sources.ptbxl:PTBXLSource",
    "cpsc2018": "coreecg.data.sources.cpsc2018:CPSC2018Source",
    "cinc2021": "coreecg.data.sources.cinc2021:CinC2021Source",
    "mimic-iv-ecg": "coreecg.data.sources.mimic:MimicIVECGSource",
    "code15": "coreecg.data.sources.code15:Code15Source",
    "wfdb": "coreecg.data.sources.wfdb_generic:WfdbFolderSource",
    "synthetic": "coreecg.data.sources.synthetic:SyntheticSource",
}


def get_source(name: str, **options) -> Source:
    """A source reader by registry name; unknown names raise ValueError listing the known ones."""
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r}; known: {', '.join(sorted(SOURCES))}")
    module, cls = SOURCES[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = ["SOURCES", "Source", "get_source"]
