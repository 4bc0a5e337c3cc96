"""Read one WFDB record (`.hea` + `.dat`/`.mat`) into millivolts, or raise RecordError.

The header TEXT is checked first (`parse_header`, with wfdb's own line patterns), because
wfdb's parse fills defaults where a field is bad: a sampling rate it cannot read becomes
250 Hz, gain 0 becomes 200/mV, and it decodes the file as ASCII, dropping other characters
(`µV` becomes `V`, `Ü0022.mat` becomes `0022.mat`). Rate, sample count and gains must parse
and be non-zero; units and lead names come from the text as written. wfdb then reads the
samples. On top, the checks wfdb does not make (or makes with messages that do not say what
is wrong): missing files, data files shorter or longer than the header describes
(truncation, wrong sample or lead count), unknown units.

Two quirks of real releases are read rather than rejected (`WfdbHeader.quirks` names them):
a record line that names the data file (CinC 2020 Georgia: `E00009.mat 12 500 5000`, which
wfdb refuses) and non-ASCII record or file names. wfdb then reads a corrected copy of the
header, in a temporary folder, beside links to the data files.

NaN samples (WFDB "invalid sample" values) are passed through: flat/NaN lead checks
belong to preprocessing, which quarantines them with its own reasons.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import wfdb
from wfdb.io.header import parse_header_content, rx_record, rx_signal

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


# "E00009.mat 12 500 5000": a record name ending in a data or header suffix (CinC 2020).
_FILE_SUFFIX = re.compile(r"\.(mat|dat|hea)$", re.IGNORECASE)
# Raw record-line and signal-line fields as the WFDB header format writes them:
# FS[/COUNTER_FREQ[(BASE_COUNTER)]] and GAIN[(BASELINE)][/UNITS].
_FS_FIELD = re.compile(r"^(?P<fs>\d+(?:\.\d*)?|\.\d+)(?:/[-\d.]*(?:\([-\d.]*\))?)?$")
_GAIN_FIELD = re.compile(
    r"^(?P<gain>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(?:\((?P<baseline>-?\d+)\))?(?:/(?P<units>.*))?$")


@dataclass
class WfdbHeader:
    """A single-segment header as its text says (wfdb's parse fills defaults instead).

    One entry per signal in the per-signal lists; `sig_len` None when the header leaves the
    length to the data file; `quirks` lists what had to be corrected before wfdb can read it.
    """

    record_name: str
    n_sig: int
    fs: float
    sig_len: int | None
    file_name: list[str]
    fmt: list[str]
    samps_per_frame: list[int]
    byte_offset: list[int]
    adc_gain: list[float]
    units: list[str]
    sig_name: list[str]
    comments: list[str]
    record_line: str                  # corrected record line
    signal_lines: list[str]
    quirks: list[str] = field(default_factory=list)


@dataclass
class WfdbSignal:
    """signal: (n_leads, n_samples) float32 in mV; lead_names as the header spells them."""

    signal: np.ndarray
    fs: float
    lead_names: tuple[str, ...]
    comments: list[str]
    units: tuple[str, ...]
    quirks: list[str] = field(default_factory=list)


def header_fields(comments: list[str]) -> dict[str, str]:
    """'#Dx: 1,2' / '# Age: 74' comment lines -> {'dx': '1,2', 'age': '74'} (keys lower-cased)."""
    out: dict[str, str] = {}
    for line in comments:
        key, sep, value = line.strip().lstrip("#").partition(":")
        if sep and key.strip():
            out.setdefault(key.strip().lower(), value.strip())
    return out


# Header comment fields that carry a patient id, matched after lower-casing and folding runs
# of spaces, "_", "-" and "." to one space: "# Patient ID: 1234" (CODE-15% as WFDB), "#Patient:",
# "#PatientID:", "#Subject:", "#Subject_ID:", "#Patient number:". First match in this order wins.
PATIENT_FIELDS: tuple[str, ...] = ("patient id", "patientid", "patient", "patient no", "patient number",
                                   "subject id", "subjectid", "subject")
_NO_VALUE = {"", "unknown", "nan", "none", "n/a", "na", "null", "-"}


def patient_from_comments(comments: list[str]) -> str | None:
    """The patient id a header's comment lines give (see PATIENT_FIELDS), or None."""
    fields = {re.sub(r"[\s_.\-]+", " ", k).strip(): v for k, v in header_fields(comments).items()}
    for key in PATIENT_FIELDS:
        value = fields.get(key, "").strip()
        if value.lower() not in _NO_VALUE:
            return value
    return None


def header_data_files(hea: Path) -> set[str]:
    """Data file names a header's signal lines give (first field); empty if it cannot be read.

    For listing only: a broken header is quarantined when its own record is read.
    """
    try:
        lines, _ = parse_header_content(_read_text(hea, str(hea)))
    except RecordError:
        return set()
    return {line.split()[0] for line in lines[1:]}


def unit_scale_to_mv(unit: str) -> float | None:
    """Factor that turns a value in `unit` into mV; None for units that are not voltages."""
    return _UNIT_TO_MV.get(unit.strip().lower())


def _read_text(hea: Path, shown: str) -> str:
    """Header bytes as text: UTF-8, else Latin-1 (every byte decodes, so names show as written)."""
    try:
        raw = hea.read_bytes()
    except OSError as exc:
        raise RecordError(shown, f"unreadable header file: {hea.name}: {exc}") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def parse_header(hea: str | Path, shown: str | None = None) -> WfdbHeader:
    """The header text at `hea` -> WfdbHeader, or RecordError naming what is wrong.

    Refused: no record line or invalid syntax (wfdb's patterns), multi-segment records, a
    sampling rate that is missing, unparseable or zero (wfdb would assume 250 Hz), a sample
    count that is unparseable or zero, a signal line count that differs from the record
    line's, an ADC gain that is missing, unparseable or zero (wfdb would assume 200/mV).
    """
    hea = Path(hea)
    shown = shown or str(hea.with_suffix(""))
    lines, comment_lines = parse_header_content(_read_text(hea, shown))
    if not lines:
        raise RecordError(shown, f"unparseable header: {hea.name}: no record line")
    tokens = lines[0].split()
    quirks = []
    suffix = _FILE_SUFFIX.search(tokens[0])
    if suffix and "/" not in tokens[0]:
        quirks.append(f"record line names the data file ({tokens[0]})")
        tokens[0] = tokens[0][: suffix.start()]
    record_line = " ".join(tokens)
    rec = rx_record.match(record_line)
    if rec is None or not rec["record_name"] or rec["n_sig"] is None:
        raise RecordError(shown, f"unparseable header: {hea.name}: invalid syntax in record line {lines[0]!r}")
    if rec["n_seg"]:
        raise RecordError(shown, "multi-segment WFDB record (not supported)")
    if len(tokens) < 3:
        raise RecordError(shown, f"no sampling rate in header: record line {lines[0]!r} "
                                 f"(WFDB would assume 250 Hz)")
    fs_field = _FS_FIELD.match(tokens[2])
    if fs_field is None:
        raise RecordError(shown, f"unparseable sampling rate in header: {tokens[2]!r} in record line {lines[0]!r}")
    fs = float(fs_field["fs"])
    if fs == 0:
        raise RecordError(shown, f"zero sampling rate in header: record line {lines[0]!r}")
    sig_len = None
    if len(tokens) > 3:
        if not re.fullmatch(r"[0-9]+", tokens[3]):
            raise RecordError(shown, f"unparseable sample count in header: {tokens[3]!r} in record line {lines[0]!r}")
        sig_len = int(tokens[3])
        if sig_len == 0:
            raise RecordError(shown, f"zero sample count in header: record line {lines[0]!r}")
    n_sig = int(rec["n_sig"])
    if n_sig == 0:
        raise RecordError(shown, "header declares no signals")
    if len(lines) - 1 != n_sig:
        raise RecordError(shown, f"header/data mismatch: record line declares {n_sig} signals, "
                                 f"header has {len(lines) - 1} signal lines")
    per: dict[str, list] = {k: [] for k in ("file_name", "fmt", "samps_per_frame", "byte_offset",
                                            "adc_gain", "units", "sig_name")}
    for i, line in enumerate(lines[1:]):
        sig = rx_signal.match(line)
        if sig is None or not sig["file_name"]:
            raise RecordError(shown, f"unparseable header: {hea.name}: invalid syntax in signal line {line!r}")
        fields = line.split()
        if len(fields) < 3:
            raise RecordError(shown, f"no ADC gain in header: signal line {i + 1} {line!r} "
                                     f"(WFDB would assume 200/mV)")
        gain = _GAIN_FIELD.match(fields[2])
        if gain is None:  # the fields after it are unreliable too: name the line, not the lead
            raise RecordError(shown, f"unparseable ADC gain in header: {fields[2]!r} in signal line {i + 1} {line!r}")
        name = (sig["sig_name"] or "").strip() or f"signal {i + 1}"
        if float(gain["gain"]) == 0:
            raise RecordError(shown, f"uncalibrated signal (ADC gain 0 for lead {name} in header)")
        per["file_name"].append(sig["file_name"])
        per["fmt"].append(sig["fmt"])
        per["samps_per_frame"].append(int(sig["samps_per_frame"] or 1))
        per["byte_offset"].append(int(sig["byte_offset"] or 0))
        per["adc_gain"].append(float(gain["gain"]))
        per["units"].append(gain["units"] or "mV")   # WFDB's default unit
        per["sig_name"].append(name)
    if not all(line.isascii() for line in [record_line, *lines[1:]]):
        quirks.append("non-ASCII characters in record or signal lines")
    return WfdbHeader(record_name=rec["record_name"], n_sig=n_sig, fs=fs, sig_len=sig_len, **per,
                      comments=[c.strip(" \t#") for c in comment_lines], record_line=record_line,
                      signal_lines=lines[1:], quirks=quirks)


def _check_data_files(header: WfdbHeader, folder: Path, shown: str) -> None:
    """Each data file must exist and hold exactly the bytes the header describes."""
    per_file: dict[str, list[int]] = {}
    for i, fname in enumerate(header.file_name):
        per_file.setdefault(fname, []).append(i)
    for fname, sigs in per_file.items():
        fpath = folder / fname
        if not fpath.is_file():
            raise RecordError(shown, f"missing data file: {fname}")
        fmt = header.fmt[sigs[0]]
        if header.sig_len is None or fmt not in _BYTES_PER_SAMPLE:
            continue  # no length to compare against, or a compressed format
        num, den = _BYTES_PER_SAMPLE[fmt]
        spf = sum(header.samps_per_frame[i] for i in sigs)
        offset = header.byte_offset[sigs[0]]
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


def _rdrecord_corrected(header: WfdbHeader, folder: Path) -> wfdb.Record:
    """wfdb.rdrecord on a corrected ASCII copy of the header, beside links to the data files.

    wfdb reads headers from disk only, as ASCII, and refuses a record line that names the
    data file; the copy fixes both while the samples are read from the original files.
    """
    with tempfile.TemporaryDirectory(prefix="coreecg-wfdb-") as tmp:
        names: dict[str, str] = {}
        for fname in dict.fromkeys(header.file_name):
            suffix = Path(fname).suffix if Path(fname).suffix.isascii() else ""
            names[fname] = fname if fname.isascii() else f"data{len(names)}{suffix}"
            link = Path(tmp) / names[fname]
            try:
                os.symlink((folder / fname).resolve(), link)
            except OSError:  # a filesystem without symlinks
                shutil.copyfile(folder / fname, link)
        lines = ["record " + header.record_line.split(None, 1)[1]]
        for fname, line in zip(header.file_name, header.signal_lines):
            rest = line.split(None, 1)[1].encode("ascii", "ignore").decode()  # units/names: from our parse
            lines.append(f"{names[fname]} {rest}")
        (Path(tmp) / "record.hea").write_text("\n".join(lines) + "\n", encoding="ascii")
        return wfdb.rdrecord(str(Path(tmp) / "record"))


def read_wfdb(record_path: str | Path) -> WfdbSignal:
    """Read `record_path` (without extension) -> WfdbSignal in mV, (leads, samples).

    Raises RecordError for a missing/unparseable header (see `parse_header`), missing,
    truncated or oversized data files, non-voltage units, or anything wfdb cannot read.
    """
    record_path = Path(record_path)
    shown = str(record_path)
    hea = record_path.with_name(record_path.name + ".hea")
    if not hea.is_file():
        raise RecordError(shown, f"missing header file: {hea.name}")
    header = parse_header(hea, shown)
    _check_data_files(header, record_path.parent, shown)

    scales = []
    for name, unit in zip(header.sig_name, header.units):
        scale = unit_scale_to_mv(unit)
        if scale is None:
            raise RecordError(shown, f"unknown units: {unit!r} for lead {name}")
        scales.append(scale)

    try:
        if header.quirks:
            rec = _rdrecord_corrected(header, record_path.parent)
        else:
            rec = wfdb.rdrecord(str(record_path))
    except Exception as exc:
        raise RecordError(shown, f"wfdb could not read the data: {exc}") from exc
    data = rec.p_signal
    if data is None or data.shape != (header.sig_len or data.shape[0], header.n_sig):
        got = None if data is None else data.shape
        raise RecordError(shown, f"header/data mismatch: read {got}, header says "
                                 f"({header.sig_len} samples, {header.n_sig} leads)")
    if float(rec.fs) != header.fs:  # wfdb parsed the rate differently from the header text
        raise RecordError(shown, f"unparseable sampling rate in header: wfdb read {rec.fs}, "
                                 f"the header text says {header.fs:g}")
    signal = (data.T * np.asarray(scales)[:, None]).astype(np.float32)
    return WfdbSignal(signal=signal, fs=header.fs, lead_names=tuple(header.sig_name),
                      comments=header.comments, units=tuple(header.units), quirks=list(header.quirks))
