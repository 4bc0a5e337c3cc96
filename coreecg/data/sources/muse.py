"""GE MUSE XML resting ECGs (root element `RestingECG`): the rhythm strip, as millivolts.

What is read, per file (parsed with the stdlib ElementTree: the `restecg.dtd` that MUSE files
declare is never fetched, the declared encoding, ISO-8859-1 or UTF-8, is honoured):

- the `<Waveform>` whose `WaveformType` is "Rhythm" (the 10 s strip; "Median" is a computed
  average beat, not a recording); no rhythm waveform: RecordError;
- its rate: `SampleBase` x 10**`SampleExponent` (absent: 0). GE publishes no schema for it; the
  open MUSE parsers read the exponent as a power of ten (ECGSampleBase/ECGSampleExponent alike),
  and every file seen so far has 0, where powers of 2 and 10 agree;
- per `<LeadData>`: `LeadID`, `WaveFormData` (base64 of little-endian int16; line breaks inside),
  times `LeadAmplitudeUnitsPerBit` in `LeadAmplitudeUnits` (MICROVOLTS, MILLIVOLTS; missing or
  unknown: RecordError). The decoded bytes must fill `LeadByteCountTotal` and
  2 x `LeadSampleCountTotal` (fewer: "truncated base64") and match `LeadDataCRC32` when given
  (a mismatch: RecordError, the waveform is damaged). A `LeadDataCRC32` of 0 on every lead is a
  writer that computed none, not damage: the samples are read unchecked, and meta["notes"] says
  so ("no checksum: LeadDataCRC32 0 on every lead (...)"). Samples other than 2 bytes, or a lead
  that starts late, at an offset or with a baseline (`LeadTimeOffset`, `LeadOffsetFirstSample`,
  `FirstSampleBaseline` not 0), are refused: their meaning is not documented, so the signal would
  be a guess;
- `PatientDemographics/PatientID` (stripped; empty: None), hashed later by the corpus builder.

Carts store 8 leads (I, II, V1-V6): the limb leads III, aVR, aVL and aVF are derived from I and II
(Einthoven and Goldberger: III = II - I, aVR = -(I + II)/2, aVL = I - II/2, aVF = II - I/2) and
named in `meta["derived_leads"]`. Without I or II nothing is derived, and lead selection refuses
the record naming the missing leads.

NEVER read: names (patient, physicians), birth date, diagnosis statements, test reasons, site or
order text, or any other free text; they are not looked up at all, not even into `meta`.
"""
from __future__ import annotations

import base64
import binascii
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coreecg.data.leads import canonical_lead_name
from coreecg.data.record import RecordError
from coreecg.data.sources.exports import (
    LABEL_FREE, Export, ExportOptions, ExportSource, millivolts_per, other_format_reason, parse_number, sniff,
)
from coreecg.data.sources.registry import register_source

ROOT = "RestingECG"
RHYTHM = "rhythm"
# Leads derived from I and II (mV, (n,) each) when the file does not store them.
LIMB_FROM_I_II = {
    "III": lambda i, ii: ii - i,
    "aVR": lambda i, ii: -(i + ii) / 2,
    "aVL": lambda i, ii: i - ii / 2,
    "aVF": lambda i, ii: ii - i / 2,
}
# Lead fields whose non-zero value would shift or offset the samples in an undocumented way.
_MUST_BE_ZERO = ("LeadTimeOffset", "LeadOffsetFirstSample", "FirstSampleBaseline")


@dataclass
class MuseOptions(ExportOptions):
    """The config section data.sources.muse: the shared export options (labels table, class map,
    multilabel); MUSE files need none of their own."""


@register_source("muse", options=MuseOptions, label_free=LABEL_FREE, dataset_label="GE MUSE XML")
class MuseSource(ExportSource):
    """GE MUSE XML reader: one record per `RestingECG` file, its rhythm strip in millivolts."""

    name = "muse"
    formats = ("muse",)
    suffixes = (".xml",)
    format_label = "GE MUSE XML"

    def read_export(self, path: str) -> Export:
        root = _parse(path)
        waveform = _rhythm_waveform(root, path)
        names, rows, units, crcs = [], [], set(), []
        for lead in waveform.findall("LeadData"):
            name, data, mv_per_bit, unit, crc = _read_lead(lead, path)
            if name in names:
                raise RecordError(path, f"lead {name} stored twice in the rhythm waveform")
            names.append(name)
            rows.append(np.frombuffer(data, dtype="<i2") * mv_per_bit)
            units.add(unit)
            crcs.append((name, data, crc))
        if not rows:
            raise RecordError(path, "the rhythm waveform holds no LeadData")
        crc_checked, notes = _check_crcs(crcs, path)
        counts = {n: r.size for n, r in zip(names, rows)}
        if len(set(counts.values())) > 1:
            raise RecordError(path, "leads of different lengths: " + ", ".join(f"{n} {c}" for n, c in counts.items()))
        derived = _derive_limb_leads(dict(zip(names, rows)))
        signal = np.stack(rows + list(derived.values()))
        patient = (root.findtext("PatientDemographics/PatientID") or "").strip() or None
        meta = {"waveform": "Rhythm", "stored_leads": names, "derived_leads": list(derived),
                "samples": int(signal.shape[1]), "amplitude_units": sorted(units), "crc32_checked_leads": crc_checked,
                "notes": notes,
                "muse_version": (root.findtext("MuseInfo/MuseVersion") or "").strip() or None,
                "acquisition_device": (root.findtext("TestDemographics/AcquisitionDevice") or "").strip() or None}
        return Export(signal, _sampling_rate(waveform, path), tuple(names) + tuple(derived), patient, meta)


def _parse(path: str) -> ET.Element:
    """The root of a MUSE file; RecordError for XML that is broken or of another kind."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise RecordError(path, f"not well-formed XML: {exc}") from exc
    if root.tag != ROOT:
        raise RecordError(path, other_format_reason(Path(path), sniff(path), MuseSource.format_label))
    return root


def _rhythm_waveform(root: ET.Element, path: str) -> ET.Element:
    """The first `<Waveform>` of type Rhythm; RecordError naming the types present otherwise."""
    waveforms = root.findall("Waveform")
    for waveform in waveforms:
        if (waveform.findtext("WaveformType") or "").strip().lower() == RHYTHM:
            return waveform
    kinds = [(w.findtext("WaveformType") or "?").strip() for w in waveforms]
    raise RecordError(path, f"no Rhythm waveform (waveforms: {', '.join(kinds) or 'none'}): "
                            "a Median beat alone is not a recording")


def _sampling_rate(waveform: ET.Element, path: str) -> float:
    """SampleBase x 10**SampleExponent in Hz (a rate <= 0 is refused by check_export)."""
    base = _number(waveform, "SampleBase", path, required=True)
    exponent = _number(waveform, "SampleExponent", path, required=False) or 0.0
    return base * 10.0 ** exponent


def _read_lead(lead: ET.Element, path: str) -> tuple[str, bytes, float, str, int | None]:
    """One `<LeadData>` -> (standard name, its samples' bytes (little-endian int16), millivolts per
    bit, its units as stored, its LeadDataCRC32 as unsigned (None: not given))."""
    raw_name = (lead.findtext("LeadID") or "").strip()
    if not raw_name:
        raise RecordError(path, "a LeadData without LeadID")
    name = canonical_lead_name(raw_name)
    what = f"lead {name}"
    for tag in _MUST_BE_ZERO:
        value = _number(lead, tag, path, required=False, what=what)
        if value:
            raise RecordError(path, f"{what}: {tag} {value:g} is not supported (only 0: aligned, unshifted samples)")
    size = _number(lead, "LeadSampleSize", path, required=False, what=what)
    if size not in (None, 2.0):
        raise RecordError(path, f"{what}: LeadSampleSize {size:g}; only 2-byte (int16) samples are read")
    per_bit = _number(lead, "LeadAmplitudeUnitsPerBit", path, required=True, what=what)
    if per_bit <= 0:
        raise RecordError(path, f"{what}: LeadAmplitudeUnitsPerBit {per_bit:g} (must be > 0)")
    unit = (lead.findtext("LeadAmplitudeUnits") or "").strip()
    mv_per_bit = per_bit * millivolts_per(unit, path, f"{what} (LeadAmplitudeUnits)")
    data = _decode(lead, path, what)
    crc = _number(lead, "LeadDataCRC32", path, required=False, what=what)
    return name, data, mv_per_bit, unit, None if crc is None else int(crc) % 2**32   # % 2**32: a writer's signed int32


def _check_crcs(leads: list[tuple[str, bytes, int | None]], path: str) -> tuple[int, list[str]]:
    """Each lead's (name, bytes, stored CRC32 or None) checked -> (leads checked, notes for meta);
    RecordError naming the first lead whose samples do not give its CRC32.

    0 on every lead that states one is no checksum: a writer that computed none (samples whose
    CRC32 is 0 in every lead are not to be expected); 0 on some leads only is checked like any
    other value."""
    stated = [crc for _, _, crc in leads if crc is not None]
    if stated and not any(stated):
        return 0, ["no checksum: LeadDataCRC32 0 on every lead (the writer computed none; samples not checked)"]
    for name, data, crc in leads:
        if crc is not None and zlib.crc32(data) != crc:
            raise RecordError(path, f"lead {name}: LeadDataCRC32 mismatch (stored {crc}, the decoded samples "
                                    f"give {zlib.crc32(data)}): the waveform is damaged")
    return len(stated), []


def _decode(lead: ET.Element, path: str, what: str) -> bytes:
    """The bytes of `WaveFormData`, checked against the byte and sample counts the lead states."""
    text = "".join((lead.findtext("WaveFormData") or "").split())
    if len(text) % 4:
        raise RecordError(path, f"{what}: truncated base64 in WaveFormData ({len(text)} characters, "
                                "not a multiple of 4)")
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise RecordError(path, f"{what}: bad base64 in WaveFormData ({exc})") from exc
    expected = {}
    byte_count = _number(lead, "LeadByteCountTotal", path, required=False, what=what)
    sample_count = _number(lead, "LeadSampleCountTotal", path, required=False, what=what)
    if byte_count is not None:
        expected["LeadByteCountTotal"] = int(byte_count)
    if sample_count is not None:
        expected["2 x LeadSampleCountTotal"] = 2 * int(sample_count)
    for field, want in expected.items():
        if len(data) < want:
            raise RecordError(path, f"{what}: truncated base64: {len(data)} bytes decoded, {field} is {want}")
        if len(data) > want:
            raise RecordError(path, f"{what}: {len(data)} bytes decoded, more than {field} ({want})")
    if len(data) % 2:
        raise RecordError(path, f"{what}: {len(data)} bytes decoded, not whole int16 samples")
    return data


def _derive_limb_leads(stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{name: (n,) mV} of III, aVR, aVL, aVF that are not stored, from I and II; {} without both."""
    if "I" not in stored or "II" not in stored:
        return {}
    i, ii = stored["I"], stored["II"]
    return {name: rule(i, ii) for name, rule in LIMB_FROM_I_II.items() if name not in stored}


def _number(element: ET.Element, tag: str, path: str, required: bool, what: str = "rhythm waveform") -> float | None:
    """A numeric child's value; None when absent and not required; RecordError otherwise."""
    text = (element.findtext(tag) or "").strip()
    if not text:
        if required:
            raise RecordError(path, f"{what}: {tag} missing")
        return None
    return parse_number(text, path, f"{what}: {tag}")


__all__ = ["MuseOptions", "MuseSource", "LIMB_FROM_I_II"]
