"""Declared overlap: a published family's weights were pretrained (or fine-tuned) on databases it
declares (`PublishedFamily.pretrained_on`), and a downstream corpus is drawn from a database. When
the downstream database is among them, or inside one of them (PhysioNet/CinC 2021 contains PTB-XL,
CPSC2018, Georgia, Chapman, Ningbo, PTB, INCART), the row is marked "declared overlap" in every
table, verdict and card: the record-level guard (coreecg.train.leakage_guard) cannot run on data
that is not here, but the family's own declaration says its test records may have been seen.

Database names are coreecg's source names and the CinC 2021 subsets, lower-case, "-" as "_".
"""
from __future__ import annotations

from typing import Any, Iterable

# The CinC 2021 training set's databases (Reyna et al. 2021, "Will Two Do?"): a model trained on
# the challenge data saw all of them.
CINC2021 = ("cpsc2018", "cpsc2018_extra", "incart", "ptb", "ptbxl", "georgia", "chapman", "ningbo")
CONTAINS: dict[str, tuple[str, ...]] = {"cinc2021": CINC2021, "physionet2021": CINC2021,
                                        "cinc2020": CINC2021[:-2]}
ALIASES = {"ptb_xl": "ptbxl", "icbeb2018": "cpsc2018", "mimic_iv_ecg": "mimic_iv_ecg", "mimic": "mimic_iv_ecg",
           "chapman_shaoxing": "chapman", "shaoxing": "chapman", "code_15": "code15", "sph": "sph"}
MARK = "declared overlap"


def canonical(name: str) -> str:
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    return ALIASES.get(key, key)


def expand(databases: Iterable[str]) -> set[str]:
    """Names -> those names and every database they contain."""
    out: set[str] = set()
    for name in map(canonical, databases):
        out.add(name)
        out.update(CONTAINS.get(name, ()))
    return out


def downstream_databases(manifest: dict[str, Any]) -> set[str]:
    """A corpus manifest -> the databases its records come from: its source, a CinC 2021 corpus's
    subsets (all of the challenge's when none is named)."""
    source = canonical(manifest.get("source", ""))
    if source == "cinc2021":
        subsets = (manifest.get("source_options") or {}).get("subsets") or []
        return {canonical(s) for s in subsets} if subsets else {"cinc2021", *CINC2021}
    return {source} if source else set()


def declared_overlap(pretrained_on: Iterable[str], manifest: dict[str, Any]) -> list[str]:
    """The downstream databases the weights declare they were trained on (sorted; empty: none)."""
    return sorted(expand(pretrained_on) & downstream_databases(manifest))


def declared_note(entry: dict[str, Any] | None) -> str:
    """metrics.json's leakage "declared" entry in words ("" when there is no declared overlap)."""
    if not isinstance(entry, dict) or not entry.get("databases"):
        return ""
    return (f"{MARK}: {entry.get('family', 'the encoder')} weights declare pretraining or fine-tuning data "
            f"({', '.join(entry.get('pretrained_on') or [])}) that contains the downstream "
            f"{', '.join(entry['databases'])}")
