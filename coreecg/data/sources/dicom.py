"""DICOM ECG waveforms (12-lead ECG Waveform Storage and General ECG Waveform Storage, and the
ECG leads of Hemodynamic Waveform Storage), one recording per Part 10 file (listed by the 'DICM'
marker, whatever the file's name).

What is read, with pydicom (`dcmread`) and numpy:

- the SOP Class UID: the two ECG waveform classes are read whole; of Hemodynamic Waveform
  Storage (a cath lab's export: ECG leads beside pressure channels) only the channels whose
  source code is a standard lead's (below; a Code Meaning alone does not count) are read, the
  others named in meta["skipped_channels"], and meta["notes"] says so ("ECG leads read from
  Hemodynamic Waveform Storage (...)"); one without such a channel is refused. Any other class
  (an image, a Holter waveform) is refused naming it;
- one multiplex group of the Waveform Sequence: the rhythm (its Multiplex Group Label holds
  "rhythm"), else the first group that is not a median / representative / average beat (of a
  hemodynamic file, among the groups holding a standard-coded ECG lead). Median beats are a
  summary of the recording, not a recording: a file with only those is refused;
- that group's Waveform Data, decoded here: signed samples of 8, 16 or 32 bits (SB, SS, SL),
  interleaved as (samples, channels), in the file's byte order; then per channel
  value = raw x Channel Sensitivity x Correction Factor (default 1) + Channel Baseline (default 0,
  in the sensitivity's units), in the units of ChannelSensitivityUnitsSequence[0] (UCUM 'uV',
  'mV', ...), converted to millivolts. A channel without a sensitivity or a voltage unit, data
  shorter (or longer) than channels x samples, or another sample encoding is refused;
- lead names from each channel's ChannelSourceSequence[0]: its code (SCPECG "5.6.3-9-<n>", MDC
  "2:<n>" or its numeric form) when it names a standard lead, else its Code Meaning ("Lead II",
  "Lead I (Einthoven)", "aVR, augmented voltage, right" -> II, I, aVR); any other channel keeps
  its meaning as its name (the lead selection downstream decides whether it is wanted);
- Patient ID (stripped; empty -> None), hashed later by the corpus builder.

Assumed: Sampling Frequency is in Hz, all channels of a group share it (as DICOM defines);
channel skew and filter settings are passed on as facts, not applied.

NEVER read: Patient's Name, Birth Date, Sex, Age, any other demographic, and no free text
(waveform annotations, acquisition context, comments, interpretation statements).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from coreecg.data.leads import canonical_lead_name
from coreecg.data.record import STANDARD_LEADS, RecordError
from coreecg.data.sources.exports import LABEL_FREE, Export, ExportOptions, ExportSource, millivolts_per
from coreecg.data.sources.registry import register_source

# Lazy imports: pydicom, where a DICOM file is read (0.8 s; python -X importtime).

# SOP classes read: 12-lead ECG Waveform Storage, General ECG Waveform Storage
ECG_SOP_CLASSES = ("1.2.840.10008.5.1.4.1.1.9.1.1", "1.2.840.10008.5.1.4.1.1.9.1.2")
# Hemodynamic Waveform Storage: read for its channels of standard ECG lead codes only
HEMODYNAMIC_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.9.2.1"
# meta["notes"] of such a file; {} is the number of channels left out
HEMODYNAMIC_NOTE = ("ECG leads read from Hemodynamic Waveform Storage (by their standard lead codes; "
                    "{} other channel(s) skipped)")
# (Waveform Bits Allocated, Waveform Sample Interpretation) -> sample type (byte order added)
SAMPLE_TYPES = {(8, "SB"): "i1", (16, "SS"): "i2", (32, "SL"): "i4"}
# Lead numbers shared by SCP-ECG (5.6.3-9-<n>) and MDC partition 2 (2:<n>) -> standard lead
LEAD_NUMBERS = {1: "I", 2: "II", 61: "III", 62: "aVR", 63: "aVL", 64: "aVF",
                **{n + 2: f"V{n}" for n in range(1, 7)}}
_CODE = re.compile(r"(?:5\.6\.3-9-|2:)(\d+)")
# Labels of groups that are summaries of beats, not recordings
_BEAT_SUMMARY = ("median", "representative", "average", "template")


@dataclass
class DicomOptions(ExportOptions):
    """The config section data.sources.dicom: the shared export options only (labels table,
    class map, multilabel); the waveform to read follows from the file (see the module)."""


@register_source("dicom", options=DicomOptions, label_free=LABEL_FREE, dataset_label="DICOM ECG")
class DicomSource(ExportSource):
    """DICOM ECG waveform reader: one record per file, its rhythm group in millivolts."""

    name = "dicom"
    formats = ("dicom",)
    suffixes = (".dcm", ".dicom")
    format_label = "DICOM ECG"

    def read_export(self, path: str) -> Export:
        ds = _dataset(path)
        uid, sop = _sop_class(ds, path)
        hemodynamic = uid == HEMODYNAMIC_SOP_CLASS
        index, group = rhythm_group(ds, path, hemodynamic)
        raw = decode_waveform(group, ds.original_encoding[1], path)
        channels = list(group.get("ChannelDefinitionSequence") or [])
        if len(channels) != raw.shape[1]:
            raise RecordError(path, f"{raw.shape[1]} waveform channels but {len(channels)} channel definitions")
        names = [lead_name(ch, j) for j, ch in enumerate(channels)]
        # a hemodynamic group's pressure (and other) channels are not ECG: left out, named
        kept = [j for j, ch in enumerate(channels) if not hemodynamic or lead_of_code(ch) is not None]
        skipped = [channel_label(ch, j) for j, ch in enumerate(channels) if j not in kept]
        signal = np.empty((len(kept), raw.shape[0]), dtype=np.float64)
        units = []
        for row, j in enumerate(kept):
            scale, offset, unit = _channel_scale(channels[j], f"channel {j + 1} ({names[j]})", path)
            signal[row] = raw[:, j] * scale + offset
            units.append(unit)
        fs = group.get("SamplingFrequency")
        if fs is None:
            raise RecordError(path, "no Sampling Frequency in the waveform group")
        meta: dict[str, Any] = {"sop_class": sop, "waveform_group": str(group.get("MultiplexGroupLabel", "")),
                                "waveform_group_index": index, "bits_allocated": int(group.WaveformBitsAllocated),
                                "stored_units": sorted(set(units)), "samples": int(raw.shape[0]),
                                "filters_hz": _filters(channels[kept[0]]), "skipped_channels": skipped,
                                "device_model": str(ds.get("ManufacturerModelName", "")).strip() or None,
                                "notes": [HEMODYNAMIC_NOTE.format(len(skipped))] if hemodynamic else []}
        pid = str(ds.get("PatientID", "") or "").strip() or None
        return Export(signal, float(fs), tuple(names[j] for j in kept), pid, meta)


def _dataset(path: str):
    """The parsed file; RecordError for what pydicom cannot read."""
    import pydicom

    try:
        return pydicom.dcmread(path)
    except Exception as exc:  # damaged files raise many kinds (InvalidDicomError, EOFError, struct.error, ...)
        raise RecordError(path, f"unreadable DICOM: {exc}") from exc


def _sop_class(ds, path: str) -> tuple[str, str]:
    """(the SOP class's UID, its name); RecordError naming it (UID and name) when it is not a
    class read here."""
    uid = ds.get("SOPClassUID") or getattr(ds, "file_meta", {}).get("MediaStorageSOPClassUID")
    if uid is None:
        raise RecordError(path, "no SOP Class UID: not a DICOM object this reader can identify")
    name = uid.name if uid.name != str(uid) else "unknown class"
    if str(uid) not in (*ECG_SOP_CLASSES, HEMODYNAMIC_SOP_CLASS):
        raise RecordError(path, f"SOP class {uid} ({name}) is not an ECG waveform (12-lead ECG, "
                                "General ECG, or Hemodynamic Waveform Storage)")
    return str(uid), name


def rhythm_group(ds, path: str, hemodynamic: bool = False) -> tuple[int, Any]:
    """(index, item) of the Waveform Sequence group to read: the first labelled rhythm, else the
    first that is not a beat summary (median, representative beat); RecordError when none.
    hemodynamic: only groups with a channel of a standard lead code count (pressure groups are
    not ECG); RecordError naming the channels when no group has one."""
    groups = list(ds.get("WaveformSequence") or [])
    if not groups:
        raise RecordError(path, "no Waveform Sequence: the file holds no waveform")
    labels = [str(g.get("MultiplexGroupLabel", "") or "").strip().lower() for g in groups]
    usable = [i for i, g in enumerate(groups)
              if not hemodynamic or any(lead_of_code(ch) for ch in g.get("ChannelDefinitionSequence") or [])]
    if not usable:
        found = dict.fromkeys(channel_label(ch, j) for g in groups
                              for j, ch in enumerate(g.get("ChannelDefinitionSequence") or []))
        raise RecordError(path, "Hemodynamic Waveform Storage without an ECG lead: no channel's source code is a "
                                "standard lead's (SCP-ECG 5.6.3-9-<n>, MDC 2:<n>; channels: "
                                f"{', '.join(found) or 'none'})")
    for i in usable:
        if "rhythm" in labels[i]:
            return i, groups[i]
    for i in usable:
        if not any(word in labels[i] for word in _BEAT_SUMMARY):
            return i, groups[i]
    found = ", ".join(repr(g.get("MultiplexGroupLabel", "")) for g in groups)
    raise RecordError(path, f"no rhythm waveform: only median / representative beats ({found})")


def decode_waveform(group, little_endian: bool, path: str) -> np.ndarray:
    """A multiplex group's Waveform Data as (samples, channels) raw integers; RecordError for an
    encoding not read here or data of another length than channels x samples x bytes."""
    missing = [k for k in ("NumberOfWaveformChannels", "NumberOfWaveformSamples", "WaveformBitsAllocated",
                           "WaveformSampleInterpretation", "WaveformData") if k not in group]
    if missing:
        raise RecordError(path, f"waveform group lacks {', '.join(missing)}")
    bits, kind = int(group.WaveformBitsAllocated), str(group.WaveformSampleInterpretation)
    if (bits, kind) not in SAMPLE_TYPES:
        raise RecordError(path, f"waveform samples of {bits} bits, {kind}: only signed 8/16/32-bit "
                                "(SB, SS, SL) are read")
    dtype = np.dtype(("<" if little_endian else ">") + SAMPLE_TYPES[bits, kind])
    n_ch, n = int(group.NumberOfWaveformChannels), int(group.NumberOfWaveformSamples)
    if n_ch <= 0 or n <= 0:
        raise RecordError(path, f"no samples: {n_ch} waveform channels x {n} samples")
    data = group.WaveformData
    expected = n_ch * n * dtype.itemsize
    # OB/OW values have even length: one padding byte may follow odd-length 8-bit data
    if not (expected <= len(data) <= expected + expected % 2):
        what = "truncated" if len(data) < expected else "too long"
        raise RecordError(path, f"Waveform Data {what}: {len(data)} bytes for {n_ch} channels x {n} samples "
                                f"x {dtype.itemsize} bytes ({expected})")
    return np.frombuffer(data, dtype=dtype, count=n_ch * n).reshape(n, n_ch)


def lead_name(channel, index: int) -> str:
    """A channel's lead: the standard name of its source code or meaning, else its meaning
    ('channel <n>' when the channel states no source)."""
    lead = lead_of_code(channel)
    if lead is not None:
        return lead
    meaning = str(_source(channel).get("CodeMeaning", "") or "").strip()
    # "Lead I (Einthoven)" -> "I"; "aVR, augmented voltage, right" -> "aVR"
    short = re.sub(r"\(.*?\)", "", meaning.split(",")[0])
    short = re.sub(r"^lead\s+", "", short.strip(), flags=re.I).strip()
    if canonical_lead_name(short) in STANDARD_LEADS:
        return canonical_lead_name(short)
    return channel_label(channel, index)


def lead_of_code(channel) -> str | None:
    """The standard lead of a channel's source code (SCP-ECG "5.6.3-9-<n>", MDC "2:<n>" or its
    numeric form), or None."""
    code = str(_source(channel).get("CodeValue", "") or "").strip()
    match = _CODE.fullmatch(code)
    number = int(match.group(1)) if match else (int(code) - (2 << 16) if code.isdigit() else None)
    return LEAD_NUMBERS.get(number)


def channel_label(channel, index: int) -> str:
    """A channel as the file names it: its source's Code Meaning, else its code, else
    'channel <n>'."""
    source = _source(channel)
    return (str(source.get("CodeMeaning", "") or "").strip() or str(source.get("CodeValue", "") or "").strip()
            or f"channel {index + 1}")


def _source(channel):
    """A channel's ChannelSourceSequence item ({} when it states none: every lookup gives the default)."""
    return (channel.get("ChannelSourceSequence") or [{}])[0]


def _channel_scale(channel, what: str, path: str) -> tuple[float, float, str]:
    """(millivolts per raw unit, offset in mV, stored unit) of one channel."""
    sensitivity = _number(channel, "ChannelSensitivity")
    if not sensitivity:
        raise RecordError(path, f"{what}: no Channel Sensitivity (the amplitude scale is unknown)")
    units = channel.get("ChannelSensitivityUnitsSequence") or []
    unit = str(units[0].get("CodeValue", "") or "").strip() if units else ""
    mv = millivolts_per(unit or None, path, what)
    correction = _number(channel, "ChannelSensitivityCorrectionFactor")
    baseline = _number(channel, "ChannelBaseline")
    return (float(sensitivity) * (1.0 if correction is None else correction) * mv,
            (baseline or 0.0) * mv, unit)


def _number(item, keyword: str) -> float | None:
    """A numeric (DS) element of `item`, or None where it is absent or empty."""
    value = item.get(keyword)
    return None if value is None or value == "" else float(value)


def _filters(channel) -> dict[str, float | None]:
    """The first channel's stated filter settings in Hz (None: not stated)."""
    return {"low": _number(channel, "FilterLowFrequency"), "high": _number(channel, "FilterHighFrequency"),
            "notch": _number(channel, "NotchFilterFrequency")}


__all__ = ["DicomSource", "DicomOptions", "ECG_SOP_CLASSES", "HEMODYNAMIC_SOP_CLASS", "rhythm_group",
           "decode_waveform", "lead_name", "lead_of_code", "channel_label"]
