"""Lead names: normalise each file's spelling, then select and reorder leads BY NAME.

Files disagree on spelling ("AVR", "avr", "aVR", "V1 ") and on order (MIMIC-IV-ECG stores
I, II, III, aVR, aVF, aVL, ...), so position is never trusted: every lead is looked up by its
canonical name. Rules, in order:

- duplicated names (after normalisation)          -> RecordError
- a lead of `cfg.leads` missing                    -> RecordError (declare a reduced-lead set
  by setting `preprocess.leads` to the subset you have)
- a standard lead not in `cfg.leads`               -> dropped (reduced-lead selection)
- a known extra lead (`cfg.extra_leads`, e.g. the Frank leads vx, vy, vz of PTB Diagnostic)
                                                   -> dropped, named in `dropped`
- any other lead (e.g. "MLII", a Holter lead that is not lead II) -> RecordError

`parse_lead_set` reads the lead sets of fine-tuning and studies ("12", "6", "1" or names).
"""
from __future__ import annotations

import numpy as np

from coreecg.data.record import STANDARD_LEADS, RecordError

_CANONICAL = {name.lower(): name for name in STANDARD_LEADS}
# The paper's lead sets: all twelve, the six limb leads, lead I.
LEAD_SETS = {"12": STANDARD_LEADS, "6": STANDARD_LEADS[:6], "1": STANDARD_LEADS[:1]}


class LeadSetError(ValueError):
    """A lead set that names no standard leads."""


def parse_lead_set(text: str) -> tuple[str, ...]:
    """12 | 6 (I, II, III, aVR, aVL, aVF) | 1 (I) | a comma list of lead names (any case) -> names."""
    if text.strip() in LEAD_SETS:
        return LEAD_SETS[text.strip()]
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    by_lower = {x.lower(): x for x in STANDARD_LEADS}
    unknown = [x for x in names if x.lower() not in by_lower]
    if unknown or not names:
        raise LeadSetError(f"lead set {text!r}: unknown lead name(s) {unknown}; give 12, 6, 1 or names from "
                           f"{', '.join(STANDARD_LEADS)}")
    return tuple(by_lower[x.lower()] for x in names)


def canonical_lead_name(name: str) -> str:
    """'AVR', 'avr', ' aVR ' -> 'aVR'; non-standard names -> stripped upper case ('vx' -> 'VX')."""
    key = name.strip()
    return _CANONICAL.get(key.lower(), key.upper())


def file_lead_rows(names: tuple[str, ...] | list[str], wanted: tuple[str, ...],
                 extra_leads: tuple[str, ...], path: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Row indices that pick `wanted` (canonical names, in that order) out of a file's leads.

    Returns (indices (len(wanted),) int, dropped extra leads as canonical names).
    Raises RecordError for duplicated, missing or unknown leads (see module docstring).
    """
    canon = [canonical_lead_name(n) for n in names]
    seen: dict[str, int] = {}
    for i, name in enumerate(canon):
        if name in seen:
            raise RecordError(path, f"duplicated lead {name!r} (rows {seen[name]} and {i})")
        seen[name] = i
    missing = [n for n in wanted if n not in seen]
    if missing:
        raise RecordError(path, f"missing lead(s) {', '.join(missing)}; file has {', '.join(canon)}")
    extra_known = {canonical_lead_name(n) for n in extra_leads}
    unknown = [n for n in canon if n not in STANDARD_LEADS and n not in extra_known]
    if unknown:
        raise RecordError(path, f"unexpected lead(s) {', '.join(unknown)}")
    dropped = tuple(n for n in canon if n in extra_known)
    return np.array([seen[n] for n in wanted], dtype=np.intp), dropped


def select_leads(signal: np.ndarray, names: tuple[str, ...] | list[str], wanted: tuple[str, ...],
                 extra_leads: tuple[str, ...], path: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """(n_file_leads, n) in file order -> (len(wanted), n) in `wanted` order, plus dropped leads."""
    if signal.ndim != 2 or signal.shape[0] != len(names):
        raise RecordError(path, f"signal shape {signal.shape} does not match {len(names)} lead names")
    idx, dropped = file_lead_rows(names, wanted, extra_leads, path)
    return signal[idx], dropped
