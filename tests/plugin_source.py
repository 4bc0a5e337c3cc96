"""A complete data source outside coreecg: a folder of NumPy recordings (one `<record>.npz` each,
`signal` (leads, samples) in ADC counts, `fs`, `leads`) listed with their label and patient by an
index file, npz_index.csv (docs/data_sources.md, "Adding a source", shows this file; tests run it).
Named in a config's `plugins`, it is `--source npz_folder` for every job."""
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from coreecg.data.record import Record, RecordError, RecordRef
from coreecg.data.sources import IndexFile, register_source

CLASS_NAMES = ("normal", "abnormal")


@dataclass
class NpzFolderOptions:                # the typed config section data.sources.npz_folder
    gain: float = 1000.0               # ADC counts per millivolt
    label_view: Literal["single", "none"] = "single"

    def __post_init__(self):           # checked whenever a config is read; the error gets the key
        if not self.gain > 0:
            raise ValueError(f"gain={self.gain} must be > 0")


@register_source("npz_folder", options=NpzFolderOptions, dataset_label="NPZ folder",
                 index_file=IndexFile("npz_index.csv", ("record", "label", "patient"),
                                      "its labels and patient ids would be lost"),
                 label_free={"label_view": "none"})          # what inference and embedding list it with
class NpzFolderSource:
    multilabel = False

    def __init__(self, gain: float = 1000.0, label_view: str = "single"):
        self.gain, self.label_view = float(gain), label_view
        self.class_names = CLASS_NAMES if label_view == "single" else ()

    def list_records(self, root):
        """One ref per row of npz_index.csv ("record,label,patient"), in the file's order."""
        index = Path(root) / "npz_index.csv"
        if not index.is_file():
            raise ValueError(f"npz_folder: no records under {root} (no npz_index.csv)")
        rows = [line.split(",") for line in index.read_text().splitlines()[1:] if line.strip()]
        return [RecordRef(self.name, record, str(Path(root) / f"{record}.npz"), {"label": label, "patient": patient})
                for record, label, patient in rows]

    def read(self, ref):
        """The recording in millivolts; RecordError (quarantined with its reason) if unreadable."""
        try:
            with np.load(ref.path) as f:
                signal, fs, leads = f["signal"] / self.gain, float(f["fs"]), tuple(str(x) for x in f["leads"])
        except (OSError, KeyError, ValueError) as e:
            raise RecordError(ref.path, f"unreadable npz ({e})") from None
        labels = (ref.extra["label"],) if self.class_names else ()
        return Record(self.name, ref.record_id, signal.astype(np.float32), fs, leads, ref.extra["patient"],
                      labels, ref.path, {})
