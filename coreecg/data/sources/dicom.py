"""DICOM ECG waveforms (12-lead ECG Waveform Storage and General ECG Waveform Storage), one
recording per Part 10 file (listed by the 'DICM' marker, whatever the file's name).

What is read, with pydicom (`dcmread`) and numpy:

- the SOP Class UID: only the two ECG waveform classes are read; any other class (an image, a
  Holter or hemodynamic waveform) is refused naming it;
- one multiplex group of the Waveform Sequence: the rhythm (its Multiplex Group Label holds
  "rhythm"), else the first group that is not a median / representative / average beat. Median
  beats are a summary of the recording, not a recording: a file with only those is refused;
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

# SOP classes read: 12-lead ECG Waveform Storage, General ECG Waveform Storage
ECG_SOP_CLASSES = ("1.2.840.10008.5.1.4.1.1.9.1.1", "1.2.840.10008.5.1.4.1.1.9.1.2")
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
        sop = _sop_class(ds, path)
        index, group = rhythm_group(ds, path)
        raw = decode_waveform(group, ds.original_encoding[1], path)
        channels = list(group.get("ChannelDefinitionSequence") or [])
        if len(channels) != raw.shape[1]:
            raise RecordError(path, f"{raw.shape[1]} waveform channels but {len(channels)} channel definitions")
        leads = tuple(lead_name(ch, j) for j, ch in enumerate(channels))
        signal = np.empty((len(channels), raw.shape[0]), dtype=np.float64)
        units = []
        for j, ch in enumerate(channels):
            scale, offset, unit = _channel_scale(ch, f"channel {j + 1} ({leads[j]})", path)
            signal[j] = raw[:, j] * scale + offset
            units.append(unit)
        fs = group.get("SamplingFrequency")
        if fs is None:
            raise RecordError(path, "no Sampling Frequency in the waveform group")
        meta: dict[str, Any] = {"sop_class": sop, "waveform_group": str(group.get("MultiplexGroupLabel", "")),
                                "waveform_group_index": index, "bits_allocated": int(group.WaveformBitsAllocated),
                                "stored_units": sorted(set(units)), "samples": int(raw.shape[0]),
                                "filters_hz": _filters(channels[0]),
                                "device_model": str(ds.get("ManufacturerModelName", "")).strip() or None}
        pid = str(ds.get("PatientID", "") or "").strip() or None
        return Export(signal, float(fs), leads, pid, meta)


def _dataset(path: str):
    """The parsed file; RecordError for what pydicom cannot read."""
    import pydicom

    try:
        return pydicom.dcmread(path)
    except Exception as exc:  # damaged files raise many kinds (InvalidDicomError, EOFError, struct.error, ...)
        raise RecordError(path, f"unreadable DICOM: {exc}") from exc


def _sop_class(ds, path: str) -> str:
    """The SOP class's name; RecordError naming it (UID and name) when it is not an ECG waveform."""
    uid = ds.get("SOPClassUID") or getattr(ds, "file_meta", {}).get("MediaStorageSOPClassUID")
    if uid is None:
        raise RecordError(path, "no SOP Class UID: not a DICOM object this reader can identify")
    name = uid.name if uid.name != str(uid) else "unknown class"
    if str(uid) not in ECG_SOP_CLASSES:
        raise RecordError(path, f"SOP class {uid} ({name}) is not an ECG waveform (12-lead ECG or "
                                "General ECG Waveform Storage)")
    return name


def rhythm_group(ds, path: str) -> tuple[int, Any]:
    """(index, item) of the Waveform Sequence group to read: the first labelled rhythm, else the
    first that is not a beat summary (median, representative beat); RecordError when none."""
    groups = list(ds.get("WaveformSequence") or [])
    if not groups:
        raise RecordError(path, "no Waveform Sequence: the file holds no waveform")
    labels = [str(g.get("MultiplexGroupLabel", "") or "").strip().lower() for g in groups]
    for i, label in enumerate(labels):
        if "rhythm" in label:
            return i, groups[i]
    for i, label in enumerate(labels):
        if not any(word in label for word in _BEAT_SUMMARY):
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
    source = (channel.get("ChannelSourceSequence") or [None])[0]
    if source is None:
        return f"channel {index + 1}"
    code = str(source.get("CodeValue", "") or "").strip()
    match = _CODE.fullmatch(code)
    number = int(match.group(1)) if match else (int(code) - (2 << 16) if code.isdigit() else None)
    if number in LEAD_NUMBERS:
        return LEAD_NUMBERS[number]
    meaning = str(source.get("CodeMeaning", "") or "").strip()
    # "Lead I (Einthoven)" -> "I"; "aVR, augmented voltage, right" -> "aVR"
    short = re.sub(r"\(.*?\)", "", meaning.split(",")[0])
    short = re.sub(r"^lead\s+", "", short.strip(), flags=re.I).strip()
    if canonical_lead_name(short) in STANDARD_LEADS:
        return canonical_lead_name(short)
    return meaning or code or f"channel {index + 1}"


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


__all__ = ["DicomSource", "DicomOptions", "ECG_SOP_CLASSES", "rhythm_group", "decode_waveform", "lead_name"]
