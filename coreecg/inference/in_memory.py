"""One recording in memory: `embed` / `predict` run a raw array through the same steps as a listed
file (`array_record` makes it the Record a reader would give), the model loaded once per path
and version of its files."""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from coreecg.data.record import Record
from coreecg.inference.engine import run_inference
from coreecg.inference.items import InferenceError, InferenceResult
from coreecg.hub import load_model
from coreecg.inference.listing import list_inputs


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, signature: tuple) -> Any:
    return load_model(path)


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, mtime_ns, size) of a model file, or of each file in a model folder: what a
    re-export or a new best.pt into the same path changes, so the cache never serves the old one."""
    files = [path] if path.is_file() else sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    return tuple((f.name, (st := f.stat()).st_mtime_ns, st.st_size) for f in files)


def _loaded(model: Any) -> Any:
    """A LoadedModel as given, or loaded once per path and version of its files (4 cached)."""
    if isinstance(model, (str, Path)):
        path = Path(model).expanduser().resolve()
        return _load_cached(str(path), _signature(path))
    if not all(hasattr(model, k) for k in ("model", "kind", "config", "contract")):
        raise TypeError(f"model: a path or a coreecg.hub.LoadedModel (load_model(...)), not {type(model).__name__}")
    return model


def array_record(signal: Any, fs: float, leads: Sequence[str], record_id: str = "array") -> Record:
    """A raw recording in memory -> the Record a reader would give (ValueError naming the problem).

    signal: (len(leads), samples) in millivolts, rows in `leads`' order (wfdb's p_signal.T), any
    float dtype (cast to float32, as the readers do); fs: its sampling rate in Hz; leads: a name
    per row, any order and case ("I", "aVR", "V1", ...)."""
    x = np.asarray(signal)
    leads = tuple(str(x_) for x_ in leads)
    if x.ndim != 2:
        raise ValueError(f"signal: (leads, samples) expected, got shape {x.shape}")
    if x.shape[0] != len(leads):
        hint = " (transpose it: rows are leads)" if x.shape[1] == len(leads) else ""
        raise ValueError(f"signal has {x.shape[0]} rows for {len(leads)} lead names {list(leads)}{hint}")
    return Record("array", record_id, x.astype(np.float32), float(fs), leads, None, (), record_id)


def _file_item(path: str | Path, fs: Any, leads: Any) -> Any:
    """The one recording in a file (WFDB, DICOM, MUSE XML, HL7 aECG, EDF) as inference lists it;
    ValueError for fs/leads given with a path (the file states them) or a file that is not one record."""
    if fs is not None or leads is not None:
        raise ValueError(f"{path}: a file states its own sampling rate and leads: give the path alone")
    items, failures = list_inputs([path])
    if failures:
        raise InferenceError(f"cannot score {path}: {failures[0].reason}")
    if len(items) != 1:
        raise ValueError(f"{path}: {len(items)} recordings, not one (use jobs/predict.py for folders)")
    return items[0]


def _score_array(signal: Any, fs: float, leads: Sequence[str], model: Any, embeddings: bool,
                 device: str, precision: str | None) -> InferenceResult:
    loaded = _loaded(model)
    item = (_file_item(signal, fs, leads) if isinstance(signal, (str, Path))
            else array_record(signal, fs, leads))
    result = run_inference(loaded, [item], embeddings=embeddings, device=device,
                           progress_every_s=math.inf, precision=precision)
    if result.failures:
        raise InferenceError(f"cannot score this recording: {result.failures[0].reason}")
    return result


def embed(signal: Any, fs: float | None = None, leads: Sequence[str] | None = None, model: Any = None, *,
          device: str = "cpu", precision: str | None = None) -> np.ndarray:
    """One raw recording of any length, rate and lead set -> its embedding (D,) float32.

    signal: (len(leads), samples) millivolts (`array_record`), or the path of a file holding one
    recording (WFDB, DICOM, GE MUSE XML, HL7 aECG, EDF: read by the reader its content asks for;
    fs and leads then come from the file: `embed("ecg.dcm", model=...)`). model: a LoadedModel or any path
    load_model reads (cached). The model's own input contract is applied, exactly as
    jobs/predict.py --embeddings does for the same record (module docstring, steps 2-5):
    band-pass, resampling, 10 s windows (a shorter record: one padded window), z-score, float16,
    the crop rule, the mean over windows; leads are taken by name. InferenceError with the
    preprocessing's reason for a recording it cannot use (too short, a missing lead, ...).
    precision: auto, fp32, bf16, int8 (jobs/predict.py's --precision; None: the model's
    inference.precision); the path is prepared and checked once per loaded model."""
    if model is None:
        raise TypeError("embed: model is required (a path or a LoadedModel)")
    return _score_array(signal, fs, leads, model, True, device, precision).embeddings[0]


def predict(signal: Any, fs: float | None = None, leads: Sequence[str] | None = None, model: Any = None, *,
            device: str = "cpu", precision: str | None = None) -> np.ndarray:
    """One raw recording (an array, or a file's path as for `embed`) -> a classifier's class
    probabilities (K,) float64, in the order of `load_model(model).contract["class_names"]`; as
    `embed` otherwise (InferenceError for an encoder, which has no classes)."""
    if model is None:
        raise TypeError("predict: model is required (a path or a LoadedModel)")
    loaded = _loaded(model)
    if loaded.kind != "classifier":
        raise InferenceError(f"{loaded.source} is an encoder: it has no class probabilities (use embed)")
    return _score_array(signal, fs, leads, loaded, False, device, precision).probs[0]
