"""A study file (`studies/*.yaml`): the paper's experiment section as data, validated against the
typed config before any Ray starts.

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
(opened once here, so a wrong path or a foreign file fails before Ray). Every pretraining and every fine-tuning config is
built here (an unknown key, variant, method, corpus, source, mode or lead name is a StudyError
"<file>: <dotted.key>: <reason>"), so a typo costs a second, not a cluster hour. The file's schema
is `StudyFile` (dataclasses, read by `coreecg.typed` like configs and search spaces);
`study_from_dict` builds a study from the same mapping made in code (a job's preset).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from coreecg.config import ConfigError, load_config
from coreecg.data.leads import LeadSetError, parse_lead_set
from coreecg.eval.fairness import Allowance
from coreecg.tune.spaces import NO_PRETRAINING, NOT_AVAILABLE, RANDOM, SCRATCH, Space, SpaceError, load_space
from coreecg.typed import Check, TypedError, load, read_yaml

MODES = ("finetune", "linear", "frozen")
FIGURES = ("reconstruction", "tsne", "mask_rates")
BUILT_IN_TABLES = ("comparison", "lead_reduction", "train_fraction")
BENCHMARK_TABLE = "benchmark"    # macro AUROC per corpus x mode (coreecg/eval/benchmark.py); asked for by name
LABEL_EFFICIENCY_TABLE = "label_efficiency"   # rows per (method, mode) (coreecg/eval/label_efficiency.py); by name
PATH_KEYS = ("data.corpus", "data.probe_corpus", "data.cache_dir")   # resolved before any trial runs


def _resolved(value: str | tuple[str, ...]) -> str:
    """A data path of the config, absolute; a mixture's list as a YAML (JSON) list."""
    if isinstance(value, tuple):
        return json.dumps([str(Path(v).expanduser().resolve()) for v in value])
    return str(Path(value).expanduser().resolve())


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
    tables: tuple[str, ...] | None = None    # default: the built-in tables when the study fine-tunes
    figures: tuple[Literal[FIGURES], ...] = ()
    set: Overrides = ()
    published: tuple[str, ...] = ()          # published-numbers files beside the benchmark table


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


# ---------------------------------------------------------------------------- the runs


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def fraction_label(fraction: float) -> str:
    return f"f{fraction * 100:g}"


@dataclass(frozen=True)
class CorpusSpec:
    """A downstream corpus: an existing folder (`path`) or one built from raw records."""

    name: str
    path: str = ""          # absolute, when given
    source: str = ""        # else: the reader (jobs/preprocess.py --source) ...
    input: str = ""         # ... of this folder (absolute)
    set: tuple[str, ...] = ()   # data.* overrides of the build (e.g. a label view)


@dataclass(frozen=True)
class PretrainCorpus(CorpusSpec):
    """A pretraining corpus of the study; one it builds leaves out the val and test records of the
    `exclude` downstream corpora (coreecg.data.pipeline.build_corpus(exclude_overlap_with=...))."""

    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class Grid:
    """One downstream grid: every combination is a fine-tuning run."""

    name: str
    corpora: tuple[str, ...]
    methods: tuple[str, ...]
    modes: tuple[str, ...]
    leads: tuple[str, ...]
    fractions: tuple[float, ...]
    seeds: tuple[int, ...]
    set: tuple[str, ...] = ()       # the grid's own fine-tuning overrides


@dataclass(frozen=True)
class PretrainRun:
    variant: str
    seed: int
    params: tuple[tuple[str, float], ...] = ()     # a mask-rate grid cell: ((key, value), ...)

    @property
    def name(self) -> str:
        cell = "".join(f"-{slug(k.rsplit('.', 1)[-1])}{v:g}" for k, v in self.params)
        return f"{slug(self.variant)}{cell}-s{self.seed}"

    @property
    def cell(self) -> str:
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={v:g}" for k, v in self.params)


@dataclass(frozen=True)
class ExternalEncoder:
    """A `downstream.encoders` entry: weights made outside the study (a coreecg run folder, export or .pt,
    or a published checkpoint such as ST-MEM's; `coreecg.loading`)."""

    method: str
    path: str               # absolute
    params: tuple = ()      # no mask-rate cell (FinetuneRun.name reads it)

    @property
    def name(self) -> str:
        return f"external:{self.method}"


@dataclass(frozen=True)
class RandomEncoder:
    """A `random` variant's encoder: the config's architecture, seeded random weights
    (finetune.encoder=random, coreecg.train.finetuning.random_encoder); no file, no pretraining."""

    method: str
    params: tuple = ()      # no mask-rate cell (FinetuneRun.name reads it)

    @property
    def name(self) -> str:
        return f"random:{self.method}"


@dataclass(frozen=True)
class FinetuneRun:
    method: str
    corpus: str
    mode: str               # finetune | linear | frozen | scratch (the supervised baseline)
    leads: str              # "12" | "6" | "1" | comma list of names
    fraction: float
    seed: int
    encoder: "PretrainRun | ExternalEncoder | RandomEncoder | None"   # None: trained from scratch
    set: tuple[str, ...] = ()   # its grid's own overrides (GridEntry.set)

    @property
    def name(self) -> str:
        cell = "".join(f"-{slug(k.rsplit('.', 1)[-1])}{v:g}" for k, v in self.encoder.params) if self.encoder else ""
        return (f"{slug(self.method)}{cell}-{slug(self.corpus)}-{self.mode}-l{slug(self.leads)}-"
                f"{fraction_label(self.fraction)}-s{self.seed}")


@dataclass(frozen=True)
class MaskRates:
    """The mask-rate figure: a two-key grid over one variant, each cell pretrained per seed and
    fine-tuned on the named corpora (12 leads, all training data, mode finetune)."""

    variant: str
    keys: tuple[str, str]
    values: tuple[tuple[float, ...], tuple[float, ...]]
    corpora: tuple[str, ...]
    seeds: tuple[int, ...]

    def runs(self) -> list[PretrainRun]:
        return [PretrainRun(self.variant, s, ((self.keys[0], a), (self.keys[1], b)))
                for a in self.values[0] for b in self.values[1] for s in self.seeds]


@dataclass(frozen=True)
class Study:
    path: Path
    name: str
    config_file: str | None
    base: tuple[str, ...]
    variants: dict[str, Any]                # name -> overrides | "scratch" | "random" | "not_available"
    unavailable: dict[str, str]             # name -> why it cannot run
    method_tables: dict[str, list[str]]     # the variants file's tables (comparison, paradigm, ...)
    pretrain_methods: tuple[str, ...]
    pretrain_seeds: tuple[int, ...]
    pretrain_set: tuple[str, ...]
    corpora: tuple[CorpusSpec, ...]
    grids: tuple[Grid, ...]
    downstream_set: tuple[str, ...]
    tables: tuple[str, ...]
    figures: tuple[str, ...]
    report_set: tuple[str, ...]
    mask_rates: MaskRates | None = None
    encoders: dict[str, str] = field(default_factory=dict)   # method -> an external encoder's path
    published: tuple[str, ...] = ()                          # published-numbers files (absolute)
    extra: tuple[str, ...] = field(default=())   # --set of the command line, over everything
    allow: tuple[Allowance, ...] = ()            # the variants file's declared differences
    pretrain_corpora: tuple[PretrainCorpus, ...] = ()   # the pretraining data (empty: data.corpus)

    # ------------------------------------------------------------------ runs

    def pretrain_runs(self) -> list[PretrainRun]:
        runs = [PretrainRun(v, s) for v in self.pretrain_methods for s in self.pretrain_seeds]
        return runs + (self.mask_rates.runs() if self.mask_rates else [])

    def mask_rate_runs(self) -> list[FinetuneRun]:
        """The mask-rate figure's fine-tunings (kept out of the tables)."""
        m = self.mask_rates
        if m is None:
            return []
        return [FinetuneRun(m.variant, corpus, "finetune", "12", 1.0, run.seed, run)
                for run in m.runs() for corpus in m.corpora]

    def encoder_for(self, method: str, seed: int) -> PretrainRun | ExternalEncoder | RandomEncoder | None:
        if method in self.encoders:
            return ExternalEncoder(method, self.encoders[method])
        if self.variants.get(method) == SCRATCH:
            return None
        if self.variants.get(method) == RANDOM:
            return RandomEncoder(method)
        return PretrainRun(method, seed if seed in self.pretrain_seeds else self.pretrain_seeds[0])

    def finetune_runs(self) -> list[FinetuneRun]:
        runs: dict[str, FinetuneRun] = {}
        for g in self.grids:
            for corpus in g.corpora:
                for method in g.methods:
                    if method in self.unavailable:
                        continue
                    for mode in (("scratch",) if self.variants.get(method) == "scratch" else g.modes):
                        for leads in g.leads:
                            for fraction in g.fractions:
                                for seed in g.seeds:
                                    run = FinetuneRun(method, corpus, mode, leads, fraction, seed,
                                                      self.encoder_for(method, seed), g.set)
                                    if runs.setdefault(run.name, run).set != run.set:
                                        raise StudyError(f"{self.path}: downstream.grids.{g.name}: run {run.name} is "
                                                         f"also in another grid with other `set` overrides "
                                                         f"({list(runs[run.name].set)} vs {list(run.set)})")
        return list(runs.values())

    @property
    def methods(self) -> list[str]:
        """Every downstream method, in first-seen order (the tables' rows)."""
        return list(dict.fromkeys(m for g in self.grids for m in g.methods))

    def pretrain_overrides(self, run: PretrainRun, corpora: dict[str, Path] | None = None) -> list[str]:
        """The run's overrides; `corpora` (name -> built folder) the study's pretraining corpora,
        as data.corpus last (the study file names its pretraining data; the reader refuses a
        data.corpus of its own beside pretrain.corpora)."""
        cell = [f"{k}={v}" for k, v in run.params]
        # a mask-rate cell is judged by its probe too (the cheap mode the figure compares against)
        probe = ["train.eval_every_epochs=1"] if run.params else []
        label = f"{run.variant} ({run.cell})" if run.params else run.variant
        data = [f"data.corpus={self.pretrain_corpus_value(corpora)}"] if self.pretrain_corpora and corpora else []
        return [*self.base, *self.variants[run.variant], *self.pretrain_set, *cell, *probe,
                f"train.seed={run.seed}", f"train.variant={label}", *self.extra, *data]

    def planned_pretrain_corpora(self) -> dict[str, Path]:
        """Where each pretraining corpus will be: its path, or corpora/<name> under the study's output
        (relative: the run configs are checked with it before any output folder exists)."""
        return {c.name: Path(c.path or f"corpora/{c.name}") for c in self.pretrain_corpora}

    def pretrain_corpus_value(self, corpora: dict[str, Path]) -> str:
        """data.corpus of the pretraining runs: the one corpus, or the mixture's list (in file order)."""
        paths = [str(Path(corpora[c.name]).resolve()) for c in self.pretrain_corpora]
        return paths[0] if len(paths) == 1 else json.dumps(paths)

    def finetune_overrides(self, run: FinetuneRun, more: list[str] | tuple[str, ...] = ()) -> list[str]:
        """The run's overrides; `more` (its corpus and encoder) before the command line's --set."""
        leads = parse_lead_set(run.leads)
        method = f"{run.method} ({run.encoder.cell})" if run.encoder and run.encoder.params else run.method
        out = [*self.base, *self.downstream_set, *run.set, f"finetune.mode={run.mode}", f"finetune.leads=[{','.join(leads)}]",
               f"finetune.train_fraction={run.fraction}", f"train.seed={run.seed}", f"finetune.method={method}",
               f"finetune.dataset={run.corpus}"]
        if isinstance(run.encoder, RandomEncoder):     # no file: the run's own config says it
            out.append(f"finetune.encoder={RANDOM}")
        return [*out, *more, *self.extra]

    def report_overrides(self) -> list[str]:
        return [*self.base, *self.report_set, *self.extra]

    def table_rows(self) -> dict[str, list[str]]:
        """Each table's rows (methods that run): the variants file's row list, else every method."""
        runnable = [m for m in self.methods if m not in self.unavailable]
        out = {t: [m for m in self.method_tables.get(t, runnable) if m in runnable] for t in self.tables}
        for t in set(out) & set(BUILT_IN_TABLES):      # given encoders join the built-in tables, last
            out[t] += [m for m in self.encoders if m in runnable and m not in out[t]]
        return out


# ---------------------------------------------------------------------------- loading


def load_study(path: str | Path, extra: list[str] | tuple[str, ...] = ()) -> Study:
    """Read and validate a study file (every run's config is built once here)."""
    path = Path(path).resolve()
    return study_from_dict(read_yaml(path, StudyError), path, extra)


def study_from_dict(data: dict[str, Any], origin: Path, extra: list[str] | tuple[str, ...] = ()) -> Study:
    """A study from a study file's mapping (a job's preset builds one in code). `origin`: the
    file it stands for: relative paths are from its folder, errors name it, its stem is the
    default name. `extra`: the command line's --set, over every run."""
    origin = Path(origin).resolve()
    spec = load(StudyFile, data, origin=str(origin), error=StudyError)
    study = _Reader(origin, spec, tuple(extra)).study()
    configs = _check_run_configs(study)
    _check_fair_tables(study, configs)
    return study


class _Reader:
    """A `StudyFile` made a `Study`: paths resolved, every name checked against the variants file."""

    def __init__(self, path: Path, spec: StudyFile, extra: tuple[str, ...]):
        self.path, self.spec = path, spec
        self.config_file = self.relative("config", spec.config) if spec.config else None
        # Data paths: in the study's `set` relative to the study file, on the command line and in
        # the config to the current folder; trials run elsewhere (and on other nodes), so absolute.
        self.base = self.absolute_paths("set", spec.set, path.parent)
        extra = self.absolute_paths("--set", extra, Path.cwd())
        self.given_extra = extra
        cfg = _config(path, "config + set + --set", self.config_file, [*self.base, *extra])
        given = {o.partition("=")[0].strip() for o in (*self.base, *extra)}
        self.extra = extra + tuple(f"{key}={_resolved(getattr(cfg.data, key[5:]))}"
                                   for key in PATH_KEYS if key not in given and getattr(cfg.data, key[5:]))
        self.space = self.variants_file()

    def error(self, key: str, reason: str) -> StudyError:
        return StudyError(f"{self.path}: {key}: {reason}")

    def relative(self, key: str, value: str, folder: Path | None = None) -> str:
        """A path, absolute: ~ and $VARS expanded (the driver's environment: shared storage on a
        cluster, e.g. ray job submit --runtime-env-json '{"env_vars": {"CORPORA": "/mnt/shared/
        corpora"}}'), a relative one from `folder` (default: the study file's)."""
        expanded = os.path.expandvars(str(value))
        if "$" in expanded:
            raise self.error(key, f"{value!r}: environment variable not set")
        p = Path(expanded).expanduser()
        return str(p if p.is_absolute() else ((folder or self.path.parent) / p).resolve())

    def absolute_paths(self, key: str, overrides: tuple[str, ...], folder: Path) -> tuple[str, ...]:
        """The overrides with their data.* paths absolute (relative ones from `folder`)."""
        split = [(o.partition("=")[0].strip(), o.partition("=")[2].strip()) for o in overrides]
        return tuple(f"{name}={self._relative_value(key, value, folder)}" if name in PATH_KEYS and value else o
                     for o, (name, value) in zip(overrides, split))

    def _relative_value(self, key: str, value: str, folder: Path) -> str:
        """One path, or a YAML list of them (data.corpus of a mixture), absolute."""
        if value.startswith("["):
            try:
                paths = yaml.safe_load(value)
            except yaml.YAMLError:
                paths = None
            if isinstance(paths, list):
                return json.dumps([self.relative(key, str(p), folder) for p in paths])
        return self.relative(key, value, folder)

    # ------------------------------------------------------------------ sections

    def variants_file(self) -> Space:
        try:
            space = load_space(self.relative("variants", self.spec.variants), self.config_file,
                               [*self.base, *self.extra])
        except SpaceError as e:
            raise self.error("variants", str(e)) from None
        if not space.variants:
            raise self.error("variants", f"{space.path} defines no variants")
        return space

    def known(self, key: str, names: tuple[str, ...] | list[str], encoders: bool = False) -> None:
        unknown = [n for n in names if n not in self.space.variants and not (encoders and n in self.spec.downstream.encoders)]
        if unknown:
            raise self.error(key, f"unknown variant(s) {unknown}; {self.space.path.name} has "
                                  f"{list(self.space.variants)}")

    def pretrain_methods(self) -> tuple[str, ...]:
        methods = self.spec.pretrain.methods
        self.known("pretrain.methods", methods)
        for m in methods:
            if self.space.variants[m] in (*NO_PRETRAINING, NOT_AVAILABLE):
                raise self.error("pretrain.methods", f"{m!r} is {self.space.variants[m]!r} and has no pretraining")
        return methods

    def corpora(self) -> tuple[CorpusSpec, ...]:
        return self.corpus_specs(self.spec.downstream.corpora, "downstream.corpora")

    def corpus_specs(self, entries: dict[str, CorpusEntry], section: str) -> tuple[CorpusSpec, ...]:
        from coreecg.data.sources import SOURCES

        out = []
        for name, c in entries.items():
            key = f"{section}.{name}"
            if bool(c.path) == bool(c.source):
                raise self.error(key, "give either path (a built corpus) or source + input (raw records to "
                                      "build one from)")
            if c.source and c.source not in SOURCES:
                raise self.error(key, f"unknown source {c.source!r}; known: {', '.join(sorted(SOURCES))}")
            folder = self.relative(f"{key}.input", c.input) if c.input else ""
            if c.source and not (folder and Path(folder).is_dir()):
                raise self.error(key, f"input folder {folder or None!r} does not exist")
            out.append(CorpusSpec(name, self.relative(f"{key}.path", c.path) if c.path else "", c.source, folder,
                                  c.set))
        return tuple(out)

    def pretrain_corpora(self, downstream: tuple[str, ...]) -> tuple[PretrainCorpus, ...]:
        """pretrain.corpora: each checked as a downstream corpus is; `exclude` names downstream
        corpora (default: all of them); a name both sections use is an error (one corpora/ folder)."""
        entries = self.spec.pretrain.corpora
        if not entries:
            return ()
        given = [o.partition("=")[0].strip() for o in (*self.spec.set, *self.spec.pretrain.set, *self.given_extra)]
        if "data.corpus" in given:
            raise self.error("pretrain.corpora", "names the pretraining data: drop data.corpus from set, "
                                                 "pretrain.set and --set")
        out = []
        for spec in self.corpus_specs(entries, "pretrain.corpora"):
            entry, key = entries[spec.name], f"pretrain.corpora.{spec.name}"
            if spec.name in downstream:
                raise self.error(key, f"{spec.name!r} is also a downstream corpus; give it another name")
            exclude = tuple(downstream) if entry.exclude is None else entry.exclude
            if [n for n in exclude if n not in downstream]:
                raise self.error(f"{key}.exclude", f"unknown corpus {[n for n in exclude if n not in downstream]}; "
                                                   f"downstream.corpora has {list(downstream)}")
            if spec.path and entry.exclude:
                raise self.error(f"{key}.exclude", "a given corpus (path) is used as built: build it with "
                                                   "jobs/preprocess.py --exclude-overlap-with, or give source + input")
            out.append(PretrainCorpus(**{**spec.__dict__, "exclude": () if spec.path else exclude}))
        return tuple(out)

    def grids(self, corpora: tuple[str, ...], pretrained: tuple[str, ...]) -> tuple[Grid, ...]:
        if not corpora:
            return ()
        named = self.spec.downstream.grids
        if named is None:
            return (self.grid("downstream", "downstream", GridEntry(), corpora, pretrained),)
        return tuple(self.grid(name, f"downstream.grids.{name}", entry or GridEntry(), corpora, pretrained)
                     for name, entry in named.items())

    def grid(self, name: str, key: str, entry: GridEntry, corpora: tuple[str, ...],
             pretrained: tuple[str, ...]) -> Grid:
        down, variants = self.spec.downstream, self.space.variants
        get = lambda f: getattr(down, f) if getattr(entry, f) is None else getattr(entry, f)   # noqa: E731
        grid_corpora = entry.corpora or corpora
        if [c for c in grid_corpora if c not in corpora]:
            raise self.error(f"{key}.corpora", f"unknown corpus {[c for c in grid_corpora if c not in corpora]}; "
                                               f"downstream.corpora has {list(corpora)}")
        methods = get("methods") or (*(n for n, v in variants.items() if v == SCRATCH), *pretrained,
                                     *self.spec.downstream.encoders)
        self.known(f"{key}.methods", methods, encoders=True)
        for m in methods:
            if (m not in self.spec.downstream.encoders and variants[m] not in (*NO_PRETRAINING, NOT_AVAILABLE)
                    and m not in pretrained):
                raise self.error(f"{key}.methods", f"{m!r} is not pretrained here (add it to pretrain.methods)")
        for leads in get("leads"):
            try:
                parse_lead_set(leads)
            except LeadSetError as e:
                raise self.error(f"{key}.leads", str(e)) from None
        return Grid(name, grid_corpora, methods, get("modes"), get("leads"), get("fractions"), get("seeds"), entry.set)

    def encoders(self) -> dict[str, str]:
        """`encoders`: each path resolved and opened as an encoder now (coreecg.loading: a
        coreecg run, export or .pt, or a published checkpoint), so a typo fails before Ray."""
        from coreecg.checkpoints import CheckpointError
        from coreecg.loading import open_source

        out = {}
        for name, value in self.spec.downstream.encoders.items():
            key = f"downstream.encoders.{name}"
            if name in self.space.variants:
                raise self.error(key, f"{name!r} is also a variant of {self.space.path.name}; give the encoder "
                                      "another name")
            path = self.relative(key, value)
            try:
                open_source(path, kind="encoder")
            except (CheckpointError, OSError) as e:
                raise self.error(key, str(e)) from None
            out[name] = path
        return out

    def published(self, tables: tuple[str, ...]) -> tuple[str, ...]:
        """report.published: files read now (coreecg.eval.benchmark), for the benchmark table."""
        from coreecg.eval.benchmark import PublishedError, load_published

        files = self.spec.report.published
        if files and BENCHMARK_TABLE not in tables:
            raise self.error("report.published", f"published numbers go beside the {BENCHMARK_TABLE!r} table; "
                                                 f"add it to report.tables")
        out = []
        for value in files:
            path = self.relative("report.published", value)
            try:
                load_published(path)
            except PublishedError as e:
                raise self.error("report.published", str(e)) from None
            out.append(path)
        return tuple(out)

    def tables(self, has_downstream: bool) -> tuple[str, ...]:
        allowed = [*BUILT_IN_TABLES, BENCHMARK_TABLE, LABEL_EFFICIENCY_TABLE,
                   *(t for t in self.space.tables if t not in BUILT_IN_TABLES)]
        tables = self.spec.report.tables
        tables = tables if tables is not None else (BUILT_IN_TABLES if has_downstream else ())
        if [t for t in tables if t not in allowed]:
            raise self.error("report.tables", f"unknown table(s) {[t for t in tables if t not in allowed]}; "
                                              f"known: {allowed}")
        return tables

    def mask_rates(self, corpora: tuple[str, ...]) -> MaskRates | None:
        mr = self.spec.mask_rates
        if mr is None:
            if "mask_rates" in self.spec.report.figures:
                raise self.error("report.figures", "names mask_rates but the study has no mask_rates section")
            return None
        self.known("mask_rates.variant", [mr.variant])
        overrides = self.space.variants[mr.variant]
        if not isinstance(overrides, list):
            raise self.error("mask_rates.variant", f"{mr.variant!r} has no pretraining")
        try:
            grid = load_space(self.relative("mask_rates.space", mr.space), self.config_file, [*self.base, *overrides])
        except SpaceError as e:
            raise self.error("mask_rates.space", str(e)) from None
        if len(grid.grid) != 2:
            raise self.error("mask_rates.space", f"a mask-rate grid needs exactly two grid keys, got {list(grid.grid)}")
        mr_corpora = mr.corpora or corpora      # none at all: the cheap mode only (the probe's heatmap)
        if (mr.corpora and not corpora) or [c for c in mr_corpora if c not in corpora]:
            raise self.error("mask_rates.corpora", f"{list(mr_corpora)} must name downstream.corpora ({list(corpora)})")
        keys = tuple(grid.grid)
        return MaskRates(mr.variant, keys, tuple(tuple(grid.grid[k]) for k in keys),
                         mr_corpora, mr.seeds)

    def study(self) -> Study:
        s = self.spec
        pretrained = self.pretrain_methods()
        encoders = self.encoders()
        corpora = self.corpora()
        names = tuple(c.name for c in corpora)
        grids = self.grids(names, pretrained)
        pretrain_corpora = self.pretrain_corpora(names)
        if pretrain_corpora and not pretrained:
            raise self.error("pretrain.corpora", "the study pretrains nothing (pretrain.methods is empty)")
        tables = self.tables(bool(corpora))
        mask_rates = self.mask_rates(names)
        if not pretrained and not corpora and mask_rates is None:
            raise StudyError(f"{self.path}: nothing to run (no pretrain.methods, downstream.corpora or mask_rates)")
        space = self.space
        return Study(path=self.path, name=s.name or self.path.stem, config_file=self.config_file, base=self.base,
                     variants=dict(space.variants), unavailable=dict(space.unavailable),
                     method_tables={k: list(v) for k, v in space.tables.items()},
                     pretrain_methods=pretrained, pretrain_seeds=s.pretrain.seeds, pretrain_set=s.pretrain.set,
                     corpora=corpora, grids=grids, downstream_set=s.downstream.set, tables=tables,
                     figures=s.report.figures, report_set=s.report.set, mask_rates=mask_rates, encoders=encoders,
                     published=self.published(tables),
                     extra=self.extra, pretrain_corpora=pretrain_corpora,
                     allow=(*space.allow, *(Allowance((name,), ("model.*",), f"{name} is a given encoder ({path}): its "
                                                  "architecture is its own") for name, path in encoders.items())))


def _config(origin: Path, where: str, config_file: str | None, overrides: list[str]):
    try:
        return load_config(config_file, overrides)
    except ConfigError as e:
        raise StudyError(f"{origin}: {where}: {e}") from None


def _check_run_configs(study: Study) -> dict[str, dict]:
    """Every run's config, once, before Ray: StudyError naming the file and the run. -> run name
    -> its config as a plain dict (what the fairness check compares)."""
    out = {}
    for run in study.pretrain_runs():
        out[run.name] = _config(study.path, f"pretraining {run.variant!r} (seed {run.seed})", study.config_file,
                                study.pretrain_overrides(run, study.planned_pretrain_corpora())).to_dict()
    for run in [*study.finetune_runs(), *study.mask_rate_runs()]:
        where = (f"fine-tuning {run.method!r} on {run.corpus} ({run.mode}, leads {run.leads}, fraction "
                 f"{run.fraction}, seed {run.seed})")
        out[run.name] = _config(study.path, where, study.config_file, study.finetune_overrides(run)).to_dict()
    _config(study.path, "report.set", study.config_file, study.report_overrides())
    return out


def _given_pretraining(study: Study) -> dict[str, dict]:
    """downstream.encoders -> the pretraining config each carries (coreecg.loading), published
    weights left out (no coreecg pretraining config: their rows' footnote says so)."""
    from coreecg.loading import open_source

    out = {}
    for method, path in study.encoders.items():
        src = open_source(path, kind="encoder")
        if not src.entries.get("published"):
            out[method] = src.config.to_dict()
    return out


def _check_fair_tables(study: Study, configs: dict[str, dict]) -> None:
    """Every table's rows differ only in what defines their method (coreecg/eval/fairness.py),
    before Ray starts: StudyError naming the table, rows and keys otherwise."""
    from coreecg.eval.benchmark import benchmark_allowance
    from coreecg.eval.fairness import FINETUNING, PRETRAINING, Entry, UnfairTableError, check_table, finetune_cell

    for table, rows in study.table_rows().items():
        benchmark = table == BENCHMARK_TABLE      # compares encoders: their pretraining is the point
        entries = [Entry(r.variant, PRETRAINING, "", configs[r.name]) for r in study.pretrain_runs()
                   if r.variant in rows and not r.params and not benchmark]
        entries += [Entry(r.method, FINETUNING, finetune_cell(r.corpus, r.mode, r.leads, r.fraction), configs[r.name])
                    for r in study.finetune_runs() if r.method in rows]
        if not benchmark:   # a given coreecg encoder's pretraining is compared as the report will
            entries += [Entry(m, PRETRAINING, "", cfg) for m, cfg in _given_pretraining(study).items() if m in rows]
        try:
            check_table(table, entries, [*study.allow, *([benchmark_allowance(rows)] if benchmark else [])])
        except UnfairTableError as e:
            raise StudyError(f"{study.path}: {e}") from None


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


def absolute_overrides(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """--set overrides with the path keys (PATH_KEYS) made absolute: given on a command line they
    are relative to its folder, in a study file they would be relative to the file."""
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        if key in PATH_KEYS and value.startswith("["):      # a mixture's list of corpora
            try:
                paths = yaml.safe_load(value)
            except yaml.YAMLError:
                paths = None
            if isinstance(paths, list):
                out.append(f"{key}={_resolved(tuple(str(p) for p in paths))}")
                continue
        out.append(f"{key}={Path(value).expanduser().resolve()}" if key in PATH_KEYS and value else o)
    return out
