"""Read one WFDB record (`.hea` + `.dat`/`.mat`) into millivolts, or raise RecordError.

wfdb does the parsing; this module adds the checks wfdb does not make (or makes with
messages that do not say what is wrong): missing files, data files shorter or longer
than the header describes (truncation, wrong sample or lead count), unknown units.
NaN samples (WFDB "invalid sample" values) are passed through: flat/NaN lead checks
belong to preprocessing, which quarantines them with its own reasons.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import wfdb

from coreecg.data.record import RecordError

# Physical units -> factor to millivolts. Keys are lower-cased ("mv" and "mV" both occur
# in CinC 2021 headers). WFDB's default when a header gives no units is mV, and wfdb
# already fills that default in.
_UNIT_TO_MV = {"mv": 1.0, "uv": 1e-3, "µv": 1e-3, "μv": 1e-3, "v": 1e3, "nv": 1e-6}

# Storage format -> bytes per sample as (numerator, denominator); compressed formats
# (508/516/524 FLAC) have no fixed size and skip the size check.
_BYTES_PER_SAMPLE = {
    "8": (1, 1), "16": (2, 1), "24": (3, 1), "32": (4, 1), "61": (2, 1), "80": (1, 1),
    "160": (2, 1), "212": (3, 2), "310": (4, 3), "311": (4, 3),
}


@dataclass
class WfdbSignal:
    """signal: (n_leads, n_samples) float32 in mV; lead_names as the header spells them."""

    signal: np.ndarray
    fs: float
    lead_names: tuple[str, ...]
    comments: list[str]
    units: tuple[str, ...]


def header_fields(comments: list[str]) -> dict[str, str]:
    """'#Dx: 1,2' / '# Age: 74' comment lines -> {'dx': '1,2', 'age': '74'} (keys lower-cased)."""
    out: dict[str, str] = {}
    for line in comments:
        key, sep, value = line.strip().lstrip("#").partition(":")
        if sep and key.strip():
            out.setdefault(key.strip().lower(), value.strip())
    return out


def unit_scale_to_mv(unit: str) -> float | None:
    """Factor that turns a value in `unit` into mV; None for units that are not voltages."""
    return _UNIT_TO_MV.get(unit.strip().lower())


def _check_data_files(header: wfdb.Record, folder: Path, shown: str) -> None:
    """Each data file must exist and hold exactly the bytes the header describes."""
    if header.sig_len is None:
        return  # header leaves the length to the file: nothing to compare against
    per_file: dict[str, list[int]] = {}
    for i, fname in enumerate(header.file_name):
        per_file.setdefault(fname, []).append(i)
    for fname, sigs in per_file.items():
        fpath = folder / fname
        if not fpath.is_file():
            raise RecordError(shown, f"missing data file: {fname}")
        fmt = header.fmt[sigs[0]]
        if fmt not in _BYTES_PER_SAMPLE:
            continue
        num, den = _BYTES_PER_SAMPLE[fmt]
        spf = sum((header.samps_per_frame[i] or 1) for i in sigs)
        offset = header.byte_offset[sigs[0]] or 0
        expected = offset + math.ceil(header.sig_len * spf * num / den)
        actual = fpath.stat().st_size
        if actual < expected:
            raise RecordError(
                shown, f"truncated data file: {fname} has {actual} bytes, header needs {expected} "
                       f"({header.sig_len} samples x {len(sigs)} leads, format {fmt})")
        if actual > expected:
            raise RecordError(
                shown, f"header/data mismatch: data file {fname} has {actual} bytes, header "
                       f"describes {expected} ({header.sig_len} samples x {len(sigs)} leads); "
                       f"sample or lead count in the header is wrong")


def read_wfdb(record_path: str | Path) -> WfdbSignal:
    """Read `record_path` (without extension) -> WfdbSignal in mV, (leads, samples).

    Raises RecordError for a missing/unparseable header, missing/truncated/oversized data
    files, non-voltage units, zero (uncalibrated) gains, or anything wfdb cannot read.
    """
    record_path = Path(record_path)
    shown = str(record_path)
    hea = record_path.with_name(record_path.name + ".hea")
    if not hea.is_file():
        raise RecordError(shown, f"missing header file: {hea.name}")
    try:
        header = wfdb.rdheader(str(record_path))
    except Exception as exc:  # wfdb raises several unrelated types for bad headers
        raise RecordError(shown, f"unparseable header: {hea.name}: {exc}") from exc
    if isinstance(header, wfdb.MultiRecord):
        raise RecordError(shown, "multi-segment WFDB record (not supported)")
    if not header.n_sig:
        raise RecordError(shown, "header declares no signals")
    _check_data_files(header, record_path.parent, shown)

    units = tuple(u or "mV" for u in header.units)
    scales = []
    for name, unit in zip(header.sig_name, units):
        scale = unit_scale_to_mv(unit)
        if scale is None:
            raise RecordError(shown, f"unknown units: {unit!r} for lead {name}")
        scales.append(scale)
    if any(g == 0 for g in header.adc_gain):
        raise RecordError(shown, "uncalibrated signal (ADC gain 0 in header)")

    try:
        rec = wfdb.rdrecord(str(record_path))
    except Exception as exc:
        raise RecordError(shown, f"wfdb could not read the data: {exc}") from exc
    data = rec.p_signal
    if data is None or data.shape != (header.sig_len or data.shape[0], header.n_sig):
        got = None if data is None else data.shape
        raise RecordError(shown, f"header/data mismatch: read {got}, header says "
                                 f"({header.sig_len} samples, {header.n_sig} leads)")
    signal = (data.T * np.asarray(scales)[:, None]).astype(np.float32)
    return WfdbSignal(signal=signal, fs=float(header.fs), lead_names=tuple(header.sig_name),
                      comments=list(header.comments or []), units=units)
