"""The study file (`studies/*.yaml`), typed: the paper's experiment section as data, validated
against the typed config before any Ray starts.

    name: tiny                                   # default: the file's stem
    config: ../configs/quickstart.yaml           # base config of every run (paths: from this file)
    set: [data.synthetic_records=512]            # overrides of every run
    variants: ../tune_spaces/ablations.yaml      # named variants (override lists, scratch, not_available)
    pretrain:
      methods: [CoRe-ECG, ST-MEM-like]           # variants pretrained, each once per seed
      seeds: [0]
      set: [optim.epochs=2]                      # pretraining-only overrides
      corpora:                                   # optional: the pretraining data, built (or found) by
        mimic: {source: mimic-iv-ecg, input: $MIMIC_IV_ECG}   # the study like downstream corpora; several:
        cinc2021: {source: cinc2021, input: $CINC2021, exclude: [ptbxl]}   # a mixture (data.corpus list);
                                                 # exclude (default: every downstream corpus): a corpus built
                                                 # here leaves out their val and test records (docs/leakage.md)
    downstream:
      corpora:                                   # name (the tables' dataset) -> an existing corpus, or
        ptbxl: {source: ptbxl, input: ../../shared/ecg-data/ptbxl}   # one the study builds once
        icbeb2018: {path: corpora/icbeb2018}
      methods: [Supervised, ST-MEM-like, CoRe-ECG]   # rows: pretrained variants, `scratch` ones, n/a ones
      modes: [finetune, linear]
      leads: ["12", "6", "1"]                    # 12, 6 (limb), 1 (lead I) or comma lists of names
      fractions: [1.0, 0.5, 0.05]
      seeds: [0, 1, 2]
      set: [finetune.epochs=2]                   # fine-tuning-only overrides
      encoders:                                  # optional: methods fine-tuned from a given encoder
        ST-MEM: ../weights/st_mem_vit_base_encoder.pth   # (any coreecg model source or a published one)
      grids:                                     # optional: several grids, each overriding the
        leads: {methods: [ST-MEM-like, CoRe-ECG], leads: ["12", "6", "1"]}   # fields above;
        fractions: {methods: [ST-MEM-like, CoRe-ECG], fractions: [1.0, 0.5, 0.05]}   # runs are shared
        probe: {modes: [linear], set: [finetune.linear_lr=1e-3]}   # a grid's own overrides (after `set` above)
    mask_rates:                                  # optional: the paper's mask-rate figure
      space: ../tune_spaces/mask_rates.yaml      # a two-key grid; every cell pretrained ...
      variant: CoRe-ECG
      corpora: [ptbxl, icbeb2018]                # ... and fine-tuned on these downstream corpora
      seeds: [0]
    report:
      tables: [comparison, lead_reduction, train_fraction, paradigm, stdm_fda]
      figures: [reconstruction, tsne, mask_rates]
      set: [report.reference=CoRe-ECG]

Paths are relative to the study file (data.* paths given with --set: to the current folder);
~ and $VARS are expanded, an unset variable is an error.

The downstream runs are the union of the grids' corpora x methods x modes x leads x fractions x
seeds (without `grids`, the one grid of the section's fields; `grids: {}`, none: the corpora then
serve the mask-rate figure's fine-tunings only); a run two grids share runs once.
A downstream seed s fine-tunes the encoder pretrained with seed s when the study pretrains one,
else the one of the first pretraining seed; a `downstream.encoders` entry is one encoder for every seed
(opened once here, so a wrong path or a foreign file fails before Ray). Every pretraining and every
fine-tuning config is built here (an unknown key, variant, method, corpus, source, mode or lead name is a StudyError
"<file>: <dotted.key>: <reason>"), so a typo costs a second, not a cluster hour. The file's schema
is `StudyFile` below (dataclasses, read by `coreecg.typed` like configs and search spaces);
coreecg.study.reader makes it a `Study` (coreecg.study.plan), `study_from_dict` from the same
mapping made in code (a preset, coreecg.study.presets). report.tables names registered tables
(coreecg.eval.tables, plugins included) or the variants file's own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from coreecg.typed import Check, TypedError

MODES = ("finetune", "linear", "frozen")
FIGURES = ("reconstruction", "tsne", "mask_rates")


class StudyError(TypedError):
    """A study file that cannot run; the message names the file and the entry."""


# ---------------------------------------------------------------------------- the file's schema

Overrides = Annotated[tuple[str, ...], Check(lambda v: all("=" in o for o in v), "must be a list of 'a.b=c' overrides")]
Names = Annotated[tuple[str, ...], Check(bool, "must not be empty")]
Seeds = Annotated[tuple[int, ...], Check(bool, "must not be empty")]
Modes = Annotated[tuple[Literal[MODES], ...], Check(bool, "must not be empty")]
Fractions = Annotated[tuple[float, ...], Check(lambda v: bool(v) and all(0 < f <= 1 for f in v),
                                               "must be fractions in (0, 1]")]


@dataclass
class CorpusEntry:
    """downstream.corpora.<name>: a built corpus (`path`) or raw records to build one from."""

    path: str = ""
    source: str = ""
    input: str = ""
    set: Overrides = ()


@dataclass
class GridEntry:
    """downstream.grids.<name>: a field not given is the downstream section's (corpora: all)."""

    corpora: Names | None = None
    methods: Names | None = None
    modes: Modes | None = None
    leads: Names | None = None
    fractions: Fractions | None = None
    seeds: Seeds | None = None
    # this grid's own fine-tuning overrides, after downstream.set (e.g. a linear probe's rate, a
    # smaller batch where a fraction holds less than one); a run two grids share must agree on them
    set: Overrides = ()


@dataclass
class DownstreamSection:
    corpora: dict[str, CorpusEntry] = field(default_factory=dict)
    methods: Names | None = None         # default: the `scratch` variants, then every pretrained one
    modes: Modes = ("finetune",)         # the supervised baseline is a `scratch` variant among the methods
    leads: Names = ("12",)
    fractions: Fractions = (1.0,)
    seeds: Seeds = (0,)
    set: Overrides = ()
    # None: one grid of the fields above; {}: none (the corpora serve mask_rates' fine-tunings only)
    grids: dict[str, GridEntry | None] | None = None
    # method name -> an encoder file or folder not pretrained here (a published checkpoint such as
    # ST-MEM's encoder.pth, an export, encoder.pt), fine-tuned as that method
    encoders: dict[str, str] = field(default_factory=dict)


@dataclass
class PretrainCorpusEntry(CorpusEntry):
    """pretrain.corpora.<name>: as a downstream corpus, plus `exclude`: the downstream corpora whose
    val and test records a corpus the study builds leaves out (None: every downstream corpus)."""

    exclude: tuple[str, ...] | None = None


@dataclass
class PretrainSection:
    methods: tuple[str, ...] = ()
    seeds: Seeds = (0,)
    set: Overrides = ()
    # the pretraining data, built (or found) by the study: one corpus, or a mixture in this order
    # (data.corpus_weights in `set` weighs it); empty: the config's data.corpus
    corpora: dict[str, PretrainCorpusEntry] = field(default_factory=dict)


@dataclass
class MaskRatesSection:
    space: str                           # a two-key grid file, e.g. tune_spaces/mask_rates.yaml
    variant: str = "CoRe-ECG"
    corpora: Names | None = None         # default: every downstream corpus
    seeds: Seeds = (0,)


@dataclass
class ReportSection:
    tables: tuple[str, ...] | None = None    # default: the default tables when the study fine-tunes
    figures: tuple[Literal[FIGURES], ...] = ()
    set: Overrides = ()
    published: tuple[str, ...] = ()          # published-numbers files (read by the benchmark table)


@dataclass
class StudyFile:
    """A study file as written (the module docstring); `study_from_dict` makes it a `Study`."""

    variants: str                        # a tune_spaces variants file
    name: str = ""                       # default: the file's stem
    config: str = ""
    set: Overrides = ()
    pretrain: PretrainSection = field(default_factory=PretrainSection)
    downstream: DownstreamSection = field(default_factory=DownstreamSection)
    mask_rates: MaskRatesSection | None = None
    report: ReportSection = field(default_factory=ReportSection)


def write_study_file(output: Path, study: dict[str, Any]) -> Path:
    """<output>/study.yaml: a study the presets (jobs/ablate.py, jobs/sweep_mask_rates.py) build
    from their flags, written where its runs go (`python jobs/study.py <output>/study.yaml`
    runs it again). A folder already holding another one is a StudyError (resume it with the
    same flags, or use another folder)."""
    text, path = yaml.safe_dump(study, sort_keys=False), Path(output) / "study.yaml"
    if path.is_file() and path.read_text() != text:
        raise StudyError(f"{path}: {output} holds a study built from other flags; use another --output")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
