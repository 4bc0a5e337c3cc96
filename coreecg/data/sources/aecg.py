"""HL7 aECG (FDA annotated ECG, root `AnnotatedECG`, namespace urn:hl7-org:v3): one recording per file.

What is read, from the waveform part only:

- the series: the first top-level `component/series` whose code is RHYTHM, and its first
  `component/sequenceSet` (a set holds the sequences recorded together). A REPRESENTATIVE_BEAT
  series (a median beat, a summary of the recording, as the DICOM and MUSE readers hold too) is
  never read: a file with only that is a RecordError "no RHYTHM series". Series under
  `derivation` are not top-level and are not considered. `meta` records the series codes and
  how many sets the chosen series had.
- the time: the set's first sequence coded TIME_ABSOLUTE or TIME_RELATIVE, an evenly sampled list
  (GLIST_TS or GLIST_PQ) whose `<increment value unit>` (s, ms or us) is the sampling period:
  fs = 1 / increment. No time sequence, no increment or one that is not > 0 is a RecordError.
- the leads: every other sequence coded MDC_ECG_LEAD_<X> (the MDC prefix is taken as the code
  system; `codeSystem` is not required). <X> is normalised by `canonical_lead_name`: AVR -> aVR,
  AVL -> aVL, AVF -> aVF, I..III, V1..V6 -> standard names; others keep theirs in upper case (V7,
  V3R, X, ES). Each value is an SLIST_PQ: physical = origin + scale * digits, `<digits>` being
  whitespace-separated numbers; scale and origin are converted to millivolts by their own units
  (an origin without a unit is in the scale's unit; a missing origin is 0). A scale without a
  (voltage) unit, leads of different lengths or no lead at all are RecordErrors. Sequences of
  other codes are counted in `meta["other_sequences"]` and not read.
- the patient id: the trial subject's `id` (componentOf/timepointEvent/componentOf/
  subjectAssignment/subject/trialSubject/id) as "root/extension" when both are given (an
  extension is unique only within its root, the sponsor's assigning authority: two trials may both
  have "SBJ-001"), else whichever of the two is given; None without one.

NEVER read: the subject's demographics (`subjectDemographicPerson`: name, birthTime, gender, race),
any person's or site's name, and all free text (annotations, `text`, comments such as
`subjectFindingComment`). The parser streams the file (`iterparse`) and drops each top-level part
once passed, keeping only the chosen series' elements; the rest is never looked at.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import numpy as np

from coreecg.data.leads import canonical_lead_name
from coreecg.data.record import RecordError
from coreecg.data.sources.exports import (
    LABEL_FREE, Export, ExportOptions, ExportSource, millivolts_per, parse_number,
)
from coreecg.data.sources.registry import register_source

# The series read: the rhythm (a representative beat is a computed median, not a recording).
WAVEFORMS = ("RHYTHM",)
TIME_CODES = ("TIME_ABSOLUTE", "TIME_RELATIVE")
TIME_TYPES = ("GLIST_TS", "GLIST_PQ")
LEAD_PREFIX = "MDC_ECG_LEAD_"
_SECONDS_PER = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"
# Element paths (local names) of what the scan keeps.
_SERIES = ("AnnotatedECG", "component", "series")
_SUBJECT_ID = ("AnnotatedECG", "componentOf", "timepointEvent", "componentOf", "subjectAssignment",
               "subject", "trialSubject", "id")


@dataclass
class AecgOptions(ExportOptions):
    """The config section data.sources.aecg: the shared export options (labels table), no others."""


@dataclass
class _Scan:
    """What one pass over the file keeps: the first series of each code, every series' code (file
    order), the trial subject's id."""

    series: dict[str, ET.Element] = field(default_factory=dict)
    codes: list[str] = field(default_factory=list)
    patient_id: str | None = None


@register_source("aecg", options=AecgOptions, label_free=LABEL_FREE, dataset_label="HL7 aECG")
class AecgSource(ExportSource):
    """HL7 aECG reader: the RHYTHM series (else the representative beat) of each AnnotatedECG file."""

    name = "aecg"
    formats = ("aecg",)
    suffixes = (".xml",)
    format_label = "HL7 aECG"

    def read_export(self, path: str) -> Export:
        scan = _scan(path)
        kind = next((k for k in WAVEFORMS if k in scan.series), None)
        if kind is None:
            raise RecordError(path, f"no {' or '.join(WAVEFORMS)} series (series codes: "
                                    f"{', '.join(scan.codes) or 'none'})")
        sets = _children(scan.series[kind], "component", "sequenceSet")
        if not sets:
            raise RecordError(path, f"the {kind} series has no sequenceSet")
        fs, time_code, names, rows, units, other = _decode_set(sets[0], path)
        meta = {"waveform": kind, "series": len(scan.codes), "series_codes": scan.codes,
                "sequence_sets": len(sets), "time_sequence": time_code, "samples": int(rows.shape[1]),
                "scale_units": units, "other_sequences": other}
        return Export(rows, fs, names, scan.patient_id, meta)


def _scan(path: str) -> _Scan:
    """One streaming pass: RecordError for a file that is not XML or whose root is not AnnotatedECG."""
    scan, stack = _Scan(), []
    try:
        for event, elem in ET.iterparse(path, events=("start", "end")):
            if event == "start":
                stack.append(_local(elem.tag))
                if len(stack) == 1 and stack[0] != "AnnotatedECG":
                    raise RecordError(path, f"not an HL7 aECG: root <{stack[0]}>, expected <AnnotatedECG>")
                continue
            here = tuple(stack)
            stack.pop()
            if here == _SERIES:
                code = _code(elem)
                scan.codes.append(code)
                scan.series.setdefault(code, elem)
            elif here == _SUBJECT_ID and scan.patient_id is None:
                scan.patient_id = _identifier(elem)
            if len(here) == 2:
                elem.clear()    # a finished top-level part: only the kept series outlive it
    except ET.ParseError as exc:
        raise RecordError(path, f"malformed XML: {exc}") from exc
    except OSError as exc:
        raise RecordError(path, f"unreadable file: {exc}") from exc
    return scan


def _decode_set(seqset: ET.Element, path: str):
    """A sequenceSet -> (fs Hz, time code, lead names, (leads, samples) float64 mV, scale units,
    number of sequences neither time nor lead)."""
    fs, time_code, other = None, None, 0
    names: list[str] = []
    rows: list[np.ndarray] = []
    units: set[str] = set()
    for seq in _children(seqset, "component", "sequence"):
        code, value = _code(seq), _child(seq, "value")
        if code in TIME_CODES:
            if fs is None:
                fs, time_code = _rate(value, path), code
        elif code.upper().startswith(LEAD_PREFIX):
            name = canonical_lead_name(code[len(LEAD_PREFIX):])
            row, unit = _lead_values(value, name, path)
            names.append(name)
            rows.append(row)
            units.add(unit)
        else:
            other += 1
    if fs is None:
        raise RecordError(path, f"no time sequence ({' or '.join(TIME_CODES)}): the sampling rate is unknown")
    if not rows:
        raise RecordError(path, f"leads missing: no {LEAD_PREFIX}* sequence in the sequence set")
    if len({len(r) for r in rows}) > 1:
        raise RecordError(path, "leads of different lengths: "
                                + ", ".join(f"{n} {len(r)}" for n, r in zip(names, rows)))
    return fs, time_code, tuple(names), np.stack(rows), sorted(units), other


def _rate(value: ET.Element | None, path: str) -> float:
    """Sampling rate (Hz) of an evenly sampled time sequence's value."""
    kind = _xsi_type(value)
    if kind not in TIME_TYPES:
        raise RecordError(path, f"time sequence of type {kind or 'none'}: only evenly sampled time "
                                f"({', '.join(TIME_TYPES)}) is read")
    inc = _child(value, "increment")
    if inc is None:
        raise RecordError(path, "sampling increment missing: the time sequence has no <increment>")
    unit = (inc.get("unit") or "").strip()
    if unit not in _SECONDS_PER:
        raise RecordError(path, f"sampling increment in {unit or 'no unit'!r}: expected one of "
                                f"{', '.join(_SECONDS_PER)}")
    step = parse_number(inc.get("value"), path, "sampling increment: value") * _SECONDS_PER[unit]
    if not step > 0:
        raise RecordError(path, f"sampling increment {inc.get('value')} {unit}: not > 0 (no sampling rate)")
    return round(1.0 / step, 6)     # 1 / 0.002 s is 500 Hz, not 499.99999...


def _lead_values(value: ET.Element | None, name: str, path: str) -> tuple[np.ndarray, str]:
    """An SLIST_PQ value -> ((samples,) float64 mV, the scale's unit as written)."""
    kind = _xsi_type(value)
    if kind != "SLIST_PQ":
        raise RecordError(path, f"lead {name}: value of type {kind or 'none'}, expected SLIST_PQ")
    scale, origin, digits = _child(value, "scale"), _child(value, "origin"), _child(value, "digits")
    if scale is None:
        raise RecordError(path, f"lead {name}: no <scale> (the amplitude would be a guess)")
    unit = scale.get("unit")
    what = f"scale of lead {name}"
    step = parse_number(scale.get("value"), path, f"{what}: value") * millivolts_per(unit, path, what)
    offset = 0.0
    if origin is not None:
        offset = (parse_number(origin.get("value"), path, f"origin of lead {name}: value")
                  * millivolts_per(origin.get("unit") or unit, path, f"origin of lead {name}"))
    try:
        samples = np.array((digits.text or "").split() if digits is not None else [], dtype=np.float64)
    except ValueError:
        raise RecordError(path, f"lead {name}: <digits> that are not numbers") from None
    return offset + step * samples, str(unit).strip()


def _identifier(elem: ET.Element) -> str | None:
    """An II identifier as "root/extension", or whichever is given, or None."""
    root, ext = (elem.get("root") or "").strip(), (elem.get("extension") or "").strip()
    return f"{root}/{ext}" if root and ext else (ext or root or None)


def _local(tag: str) -> str:
    """'{urn:hl7-org:v3}series' -> 'series' (files with and without the namespace read alike)."""
    return tag.rpartition("}")[2]


def _child(elem: ET.Element | None, name: str) -> ET.Element | None:
    return None if elem is None else next((c for c in elem if _local(c.tag) == name), None)


def _children(elem: ET.Element, *path: str) -> list[ET.Element]:
    """The elements at `path` (local names) below `elem`, in document order."""
    found = [elem]
    for name in path:
        found = [c for e in found for c in e if _local(c.tag) == name]
    return found


def _code(elem: ET.Element) -> str:
    code = _child(elem, "code")
    return (code.get("code") or "").strip() if code is not None else ""


def _xsi_type(value: ET.Element | None) -> str | None:
    return None if value is None else value.get(_XSI_TYPE)


__all__ = ["AecgSource", "AecgOptions", "WAVEFORMS", "TIME_CODES", "LEAD_PREFIX"]
