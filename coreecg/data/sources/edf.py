"""EDF and EDF+ exports (Holters, wearables, polysomnography): source "edf".

What is read, through pyedflib (`EdfReader`, annotations not even parsed):

- the ECG channels, as physical values (pyedflib maps digital to physical by each channel's
  digital/physical min and max), scaled to millivolts by the channel's physical dimension
  (uV, mV, V, µV; missing or not a voltage -> RecordError naming the channel);
- lead names from channel labels: a prefix "ECG"/"EKG" (also inside an EEG-style label: "EEG
  EKG1-REF", "ECG EKG"), separators (space - _ : .) and a reference suffix ("-REF", "-Ref") are
  dropped, case is ignored ("ECG I", "EKG V1-REF", "ecg_avr" -> I, V1, aVR); the bipolar limb
  derivations LA-RA, LL-RA, LL-LA are I, II, III;
- the sampling rate, which every kept ECG channel must share (EDF lets each channel have its
  own: a rate that differs is a RecordError; the skipped channels may have any rate);
- EDF+ only: the patient code (the first subfield of the patient field, '_' read as a space as
  EDF+ stores spaces); 'X' (unknown) or empty -> None.

Labels, physical dimensions and the patient code are read from the header bytes here (UTF-8,
else Latin-1), so they show as written. edflib refuses a whole file for one byte above ASCII in
any text field of its header (a temperature channel's "°C" in Latin-1, a "µV", a name with an
umlaut in the patient field); such a file is read from a copy whose text fields have those bytes
replaced by '?', in a private temporary folder deleted afterwards (the samples are not touched),
and the fields mended are named in meta["header_quirks"] ("non-ASCII characters in EDF header
fields (...)"; the corpus manifest counts it as a header correction).

What is assumed:

- a channel is ECG when its label names a standard lead, with or without the ECG/EKG prefix;
  a channel labelled only "ECG"/"EKG" (or with a bare number, "ECG1", "EEG EKG1-REF", or a
  bipolar pair of ECG electrodes, "ECG1-ECG2") names no lead: it is the lead set by
  `unnamed_lead`, or a RecordError when that option is empty (or there are two);
- every other channel (EEG, EMG, respiration, SpO2, temperature, accelerometers, and ECG
  channels of non-standard leads such as "ECG V4R" or "ECG L") is left out and named in
  meta["skipped_channels"]; a file with no ECG channel left is a RecordError "leads missing";
- EDF+D (discontinuous: gaps between data records) is refused: its samples are not one series.

What is NEVER read: the patient name, birth date, sex and additional text, the recording
field's free text, the technician, and the annotations (EDF+ "EDF Annotations" channels, which
pyedflib keeps out of the signal list). A plain EDF's patient field is free text: it is never
read, and patient_id is None.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyedflib

from coreecg.data.record import STANDARD_LEADS, RecordError
from coreecg.data.sources.exports import LABEL_FREE, Export, ExportOptions, ExportSource, millivolts_per
from coreecg.data.sources.registry import register_source

# Normalised label (no prefix, separators, reference suffix; lower case) -> lead name.
LEAD_KEYS: dict[str, str] = {name.lower(): name for name in STANDARD_LEADS} | {
    "lara": "I", "llra": "II", "llla": "III"}
# "ECG"/"EKG", after an optional modality of EEG and sleep montages ("EEG EKG1-REF", "ECG EKG")
_ECG_PREFIX = re.compile(r"\s*(?:(?:EEG|ECG|EKG)[\s_.:-]*)?(?:ECG|EKG)", re.I)
_REF_SUFFIX = re.compile(r"[\s_.:-]*ref\s*$", re.I)
_SEPARATORS = re.compile(r"[\s_.:-]+")
# What is left of a label naming no lead: nothing, an electrode number, a pair ("ECG1-ECG2": "1ecg2")
_NO_LEAD = re.compile(r"(?:\d|ecg|ekg)*")
# The EDF header's reserved field (bytes 192-236) starts with "EDF+C" or "EDF+D" in EDF+.
_RESERVED = slice(192, 197)
_NO_PATIENT = ("", "X")
_ANNOTATIONS = "EDF Annotations"
# Header text fields edflib refuses with a byte above 126: (name, start, width) in the first 256
# bytes, then per channel (name, offset, width): channel k's field starts at 256 + offset x
# channels + width x k (EDF stores all labels, then all transducers, ...).
_FILE_TEXT = (("patient field", 8, 80), ("recording field", 88, 80), ("reserved field", 192, 44))
_CHANNEL_TEXT = (("label", 0, 16), ("transducer", 16, 80), ("physical dimension", 96, 8),
                 ("prefilter", 136, 80), ("reserved field", 224, 32))
_ODD_BYTES = re.compile(rb"[\x7f-\xff]")
# meta["header_quirks"] of a mended file; {} names the fields mended
MENDED_NOTE = "non-ASCII characters in EDF header fields ({})"


class Unnamed(str):
    """The label of an ECG channel that names no lead ("ECG", "EKG", "ECG1", "EEG EKG-REF")."""


def unnamed_lead_name(text: str) -> str:
    """The `unnamed_lead` option as a lead name ('ii' -> 'II'; '' stays ''); ValueError otherwise."""
    if not text.strip():
        return ""
    if text.strip().lower() not in LEAD_KEYS:
        raise ValueError(f"unnamed_lead {text!r}: not a lead; give one of {', '.join(STANDARD_LEADS)} "
                         "(or leave it empty)")
    return LEAD_KEYS[text.strip().lower()]


def lead_of_label(label: str) -> str | Unnamed | None:
    """A channel label -> its standard lead name, Unnamed (an ECG channel naming no lead), or
    None (not a channel of a standard ECG lead: left out)."""
    prefix = _ECG_PREFIX.match(label)
    rest = label[prefix.end():] if prefix else label.strip()
    if not prefix and rest.startswith("-"):     # "-aVR": the inverted lead, not aVR
        return None
    key = _SEPARATORS.sub("", _REF_SUFFIX.sub("", rest)).lower()
    if key in LEAD_KEYS:
        return LEAD_KEYS[key]
    if prefix and _NO_LEAD.fullmatch(key):
        return Unnamed(label.strip())
    return None


@dataclass
class EdfOptions(ExportOptions):
    """The config section data.sources.edf."""

    # the lead recorded by a channel labelled only "ECG"/"EKG" (e.g. II for a one-lead Holter);
    # empty: such a channel is a RecordError (its lead would be a guess)
    unnamed_lead: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        unnamed_lead_name(self.unnamed_lead)


@register_source("edf", options=EdfOptions, label_free=LABEL_FREE, dataset_label="EDF")
class EdfSource(ExportSource):
    """EDF/EDF+ reader: one record per file. Options: the ExportOptions, and `unnamed_lead`."""

    name = "edf"
    formats = ("edf",)
    # ".rec" (an old EDF suffix) is not claimed: other formats use it too; an EDF named so is
    # still listed by its content.
    suffixes = (".edf",)
    format_label = "EDF"

    def __init__(self, labels: str = "", class_map: str = "", multilabel: bool | None = None,
                 unnamed_lead: str = "", task: str = ""):
        super().__init__(labels, class_map, multilabel, task)
        self.unnamed_lead = unnamed_lead_name(unnamed_lead)

    def read_export(self, path: str) -> Export:
        """The ECG channels of one EDF file as (leads, samples) millivolts, file order."""
        header = _read_header(path)
        mended, quirks = _mend_header(header)
        header_labels, header_units = header.labels, header.dimensions

        with _readable_copy(path, mended if quirks else None) as readable:
            try:
                edf = pyedflib.EdfReader(readable, pyedflib.DO_NOT_READ_ANNOTATIONS)
            except OSError as exc:    # edflib's reasons: not EDF compliant, file size, read error
                raise RecordError(path, f"unreadable EDF: {str(exc).removeprefix(f'{readable}: ')}") from exc
            with edf:
                plus = edf.filetype == pyedflib.FILETYPE_EDFPLUS
                # pyedflib's signals are the header's channels less EDF+'s annotation channels
                kept = [k for k, label in enumerate(header_labels) if not (plus and label == _ANNOTATIONS)]
                if len(kept) != edf.signals_in_file:
                    raise RecordError(path, f"unreadable EDF: {len(kept)} signal channels in the header, "
                                            f"edflib reads {edf.signals_in_file}")
                labels = [header_labels[k] for k in kept]
                channels, skipped = self._ecg_channels(labels, path)
                rates = {edf.getSampleFrequency(i) for i, _ in channels}
                if len(rates) > 1:
                    listed = ", ".join(f"{labels[i]!r} {edf.getSampleFrequency(i):g} Hz" for i, _ in channels)
                    raise RecordError(path, f"ECG channels at different sampling rates: {listed}")
                units = [header_units[kept[i]] for i, _ in channels]
                scale = [millivolts_per(u, path, f"channel {labels[i]!r}") for (i, _), u in zip(channels, units)]
                # physical values: pyedflib applies each channel's digital -> physical gain and offset
                signal = np.stack([edf.readSignal(i, digital=False) * s for (i, _), s in zip(channels, scale)])
        # a plain EDF's patient field is free text: never read
        patient_id = header.patient_code() if plus else None
        meta = {"file_type": "EDF+C" if plus else "EDF", "units": units,
                "channel_labels": [labels[i] for i, _ in channels], "skipped_channels": skipped,
                "header_quirks": [MENDED_NOTE.format("; ".join(quirks))] if quirks else []}
        return Export(signal, float(rates.pop()), tuple(lead for _, lead in channels), patient_id, meta)

    def _ecg_channels(self, labels: list[str], path: str) -> tuple[list[tuple[int, str]], list[str]]:
        """([(channel index, lead name)] of the kept ECG channels, labels of the skipped ones);
        RecordError for an ECG channel naming no lead, a lead given twice, or no ECG channel."""
        leads = [lead_of_label(label) for label in labels]
        unnamed = [lead for lead in leads if isinstance(lead, Unnamed)]
        if len(unnamed) > 1:
            raise RecordError(path, f"ECG channels {', '.join(map(repr, unnamed))} name no lead: "
                                    "unnamed_lead can name one channel only")
        if unnamed and not self.unnamed_lead:
            raise RecordError(path, f"ECG channel {unnamed[0]!r} names no lead: set "
                                    "data.sources.edf.unnamed_lead=II (the lead it records)")
        channels: list[tuple[int, str]] = []
        seen: dict[str, str] = {}
        for i, (label, lead) in enumerate(zip(labels, leads)):
            if lead is None:
                continue
            lead = self.unnamed_lead if isinstance(lead, Unnamed) else lead
            if lead in seen:
                raise RecordError(path, f"duplicated lead {lead} (channels {seen[lead]!r} and {label!r})")
            seen[lead] = label
            channels.append((i, lead))
        skipped = [label for label, lead in zip(labels, leads) if lead is None]
        if not channels:
            raise RecordError(path, f"leads missing: no ECG channel (channels: {', '.join(skipped) or 'none'})")
        return channels, skipped


@dataclass(frozen=True)
class _Header:
    """An EDF header as stored: `raw`, its 256 x (channels + 1) bytes; `channels` as declared."""

    raw: bytes
    channels: int

    def channel_field(self, offset: int, width: int, k: int) -> slice:
        """Where channel k's field of (offset, width) lies in `raw`."""
        start = 256 + offset * self.channels + width * k
        return slice(start, start + width)

    def texts(self, offset: int, width: int) -> list[str]:
        """One field of every channel, as text (stripped)."""
        return [_text(self.raw[self.channel_field(offset, width, k)]) for k in range(self.channels)]

    @property
    def labels(self) -> list[str]:
        return self.texts(0, 16)

    @property
    def dimensions(self) -> list[str]:
        return self.texts(96, 8)

    def patient_code(self) -> str | None:
        """EDF+'s patient code: the patient field's first subfield ('_' stands for a space)."""
        fields = _text(self.raw[8:88]).split()
        code = fields[0].replace("_", " ").strip() if fields else ""
        return None if code in _NO_PATIENT else code


def _read_header(path: str) -> _Header:
    """The header of an EDF file; RecordError for EDF+D (said plainly: edflib's own refusal does
    not name the format) and for a header that is cut short or states no channel count."""
    try:
        with open(path, "rb") as f:
            raw = f.read(256)
            channels = _channel_count(raw, path)
            raw += f.read(256 * channels)
    except OSError as exc:
        raise RecordError(path, f"unreadable EDF: {exc.strerror}") from exc
    if len(raw) < 256 * (channels + 1):
        raise RecordError(path, f"unreadable EDF: header cut short ({len(raw)} bytes of {256 * (channels + 1)})")
    return _Header(raw, channels)


def _channel_count(first: bytes, path: str) -> int:
    """The channel count of a header's first 256 bytes; RecordError for EDF+D, or a count that
    is not a number > 0."""
    if first[_RESERVED] == b"EDF+D":
        raise RecordError(path, "EDF+D (discontinuous) not supported: its data records have gaps; "
                                "export it as EDF+C (continuous)")
    field = first[252:256]
    if not field.strip().isdigit() or int(field) == 0:
        raise RecordError(path, f"unreadable EDF: number of signals {field.decode('latin-1')!r} is not a number > 0")
    return int(field)


def _mend_header(header: _Header) -> tuple[bytes, list[str]]:
    """(the header with every byte above 126 in its text fields replaced by '?', the fields
    mended: "patient field", "channel 'Temp' physical dimension", ...). Numeric fields are left
    as they are: a stray byte there is damage, not a writer's spelling."""
    raw, mended = bytearray(header.raw), []
    fields = [(name, slice(start, start + width)) for name, start, width in _FILE_TEXT]
    labels = header.labels
    fields += [(f"channel {labels[k]!r} {name}", header.channel_field(offset, width, k))
               for name, offset, width in _CHANNEL_TEXT for k in range(header.channels)]
    for name, where in fields:
        if _ODD_BYTES.search(raw[where]):
            raw[where] = _ODD_BYTES.sub(b"?", bytes(raw[where]))
            mended.append(name)
    return bytes(raw), mended


@contextmanager
def _readable_copy(path: str, header: bytes | None):
    """`path`, or (header given) a copy of the file with `header` in place of its own, in a
    private temporary folder deleted afterwards: pyedflib reads only from a path."""
    if header is None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="coreecg-edf-") as tmp:
        copy = os.path.join(tmp, "mended.edf")
        with open(path, "rb") as src, open(copy, "wb") as dst:
            dst.write(header)
            src.seek(len(header))
            shutil.copyfileobj(src, dst, 1 << 20)
        yield copy


def _text(raw: bytes) -> str:
    """Header bytes as text: UTF-8, else Latin-1 (every byte decodes: names show as written)."""
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return raw.decode("latin-1").strip()


__all__ = ["EdfOptions", "EdfSource", "lead_of_label", "unnamed_lead_name", "LEAD_KEYS", "Unnamed", "MENDED_NOTE"]
