"""EDF and EDF+ exports (Holters, wearables, polysomnography): source "edf".

What is read, through pyedflib (`EdfReader`, annotations not even parsed):

- the ECG channels, as physical values (pyedflib maps digital to physical by each channel's
  digital/physical min and max), scaled to millivolts by the channel's physical dimension
  (uV, mV, V; missing or not a voltage -> RecordError naming the channel);
- lead names from channel labels: a prefix "ECG"/"EKG", separators (space - _ : .) and a
  reference suffix ("-REF", "-Ref") are dropped, case is ignored ("ECG I", "EKG V1-REF",
  "ecg_avr" -> I, V1, aVR); the bipolar limb derivations LA-RA, LL-RA, LL-LA are I, II, III;
- the sampling rate, which every kept ECG channel must share (EDF lets each channel have its
  own: a rate that differs is a RecordError; the skipped channels may have any rate);
- EDF+ only: the patient code (the first subfield of the patient field; edflib restores the
  spaces EDF+ stores as '_'); 'X' (unknown) or empty -> None.

What is assumed:

- a channel is ECG when its label names a standard lead, with or without the ECG/EKG prefix;
  a channel labelled only "ECG"/"EKG" (or with a bare number, "ECG1") names no lead: it is the
  lead set by `unnamed_lead`, or a RecordError when that option is empty (or there are two);
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

import re
from dataclasses import dataclass

import numpy as np

from coreecg.data.record import STANDARD_LEADS, RecordError
from coreecg.data.sources.exports import LABEL_FREE, Export, ExportOptions, ExportSource, millivolts_per
from coreecg.data.sources.registry import register_source

# Normalised label (no prefix, separators, reference suffix; lower case) -> lead name.
LEAD_KEYS: dict[str, str] = {name.lower(): name for name in STANDARD_LEADS} | {
    "lara": "I", "llra": "II", "llla": "III"}
_ECG_PREFIX = re.compile(r"\s*(?:ECG|EKG)", re.I)
_REF_SUFFIX = re.compile(r"[\s_.:-]*ref\s*$", re.I)
_SEPARATORS = re.compile(r"[\s_.:-]+")
# The EDF header's reserved field (bytes 192-236) starts with "EDF+C" or "EDF+D" in EDF+.
_RESERVED = slice(192, 197)
_NO_PATIENT = ("", "X")


class Unnamed(str):
    """The label of an ECG channel that names no lead ("ECG", "EKG", "ECG1")."""


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
    if prefix and (key == "" or key.isdigit()):
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
                 unnamed_lead: str = ""):
        super().__init__(labels, class_map, multilabel)
        self.unnamed_lead = unnamed_lead_name(unnamed_lead)

    def read_export(self, path: str) -> Export:
        """The ECG channels of one EDF file as (leads, samples) millivolts, file order."""
        _refuse_discontinuous(path)
        import pyedflib

        try:
            edf = pyedflib.EdfReader(path, pyedflib.DO_NOT_READ_ANNOTATIONS)
        except OSError as exc:    # edflib's reasons: not EDF compliant, file size, read error
            raise RecordError(path, f"unreadable EDF: {str(exc).removeprefix(f'{path}: ')}") from exc
        with edf:
            labels = [str(x) for x in edf.getSignalLabels()]
            channels, skipped = self._ecg_channels(labels, path)
            rates = {edf.getSampleFrequency(i) for i, _ in channels}
            if len(rates) > 1:
                listed = ", ".join(f"{labels[i]!r} {edf.getSampleFrequency(i):g} Hz" for i, _ in channels)
                raise RecordError(path, f"ECG channels at different sampling rates: {listed}")
            units = [edf.getPhysicalDimension(i).strip() for i, _ in channels]
            scale = [millivolts_per(u, path, f"channel {labels[i]!r}") for (i, _), u in zip(channels, units)]
            # physical values: pyedflib applies each channel's digital -> physical gain and offset
            signal = np.stack([edf.readSignal(i, digital=False) * s for (i, _), s in zip(channels, scale)])
            plus = edf.filetype == pyedflib.FILETYPE_EDFPLUS
            patient_id = None
            if plus:     # a plain EDF's patient field is free text: never read
                code = edf.getPatientCode().strip()
                patient_id = None if code in _NO_PATIENT else code
        meta = {"file_type": "EDF+C" if plus else "EDF", "units": units,
                "channel_labels": [labels[i] for i, _ in channels], "skipped_channels": skipped}
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


def _refuse_discontinuous(path: str) -> None:
    """RecordError for EDF+D, said plainly (edflib's own refusal does not name the format)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError as exc:
        raise RecordError(path, f"unreadable EDF: {exc.strerror}") from exc
    if head[_RESERVED] == b"EDF+D":
        raise RecordError(path, "EDF+D (discontinuous) not supported: its data records have gaps; "
                                "export it as EDF+C (continuous)")


__all__ = ["EdfOptions", "EdfSource", "lead_of_label", "unnamed_lead_name", "LEAD_KEYS", "Unnamed"]
