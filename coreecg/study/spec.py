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
      grids:                                     # optional: several grids, each overriding the
        leads: {methods: [ST-MEM-like, CoRe-ECG], leads: ["12", "6", "1"]}   # fields above;
        fractions: {methods: [ST-MEM-like, CoRe-ECG], fractions: [1.0, 0.5, 0.05]}   # runs are shared
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
seeds (without `grids`, the one grid of the section's fields); a run two grids share runs once.
A downstream seed s fine-tunes the encoder pretrained with seed s when the study pretrains one,
else the one of the first pretraining seed. Every pretraining and every fine-tuning config is
built here (an unknown key, variant, method, corpus, source, mode or lead name is a StudyError
naming the file and the entry), so a typo costs a second, not a cluster hour.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coreecg.config import ConfigError, load_config

MODES = ("finetune", "linear")
FIGURES = ("reconstruction", "tsne", "mask_rates")
BUILT_IN_TABLES = ("comparison", "lead_reduction", "train_fraction")
TOP_KEYS = {"name", "config", "set", "variants", "pretrain", "downstream", "mask_rates", "report"}
SECTION_KEYS = {
    "pretrain": {"methods", "seeds", "set"},
    "downstream": {"corpora", "methods", "modes", "leads", "fractions", "seeds", "set", "grids"},
    "report": {"tables", "figures", "set"},
    "mask_rates": {"space", "variant", "corpora", "seeds"},
}
CORPUS_KEYS = {"path", "source", "input", "set"}
PATH_KEYS = ("data.corpus", "data.probe_corpus", "data.cache_dir")   # resolved before any trial runs
GRID_KEYS = {"corpora", "methods", "modes", "leads", "fractions", "seeds"}


class StudyError(ValueError):
    """A study file that cannot run; the message names the file and the entry."""


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
class Grid:
    """One downstream grid: every combination is a fine-tuning run."""

    name: str
    corpora: tuple[str, ...]
    methods: tuple[str, ...]
    modes: tuple[str, ...]
    leads: tuple[str, ...]
    fractions: tuple[float, ...]
    seeds: tuple[int, ...]


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
class FinetuneRun:
    method: str
    corpus: str
    mode: str               # finetune | linear | scratch (the supervised baseline)
    leads: str              # "12" | "6" | "1" | comma list of names
    fraction: float
    seed: int
    encoder: PretrainRun | None   # None: trained from scratch

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
    variants: dict[str, Any]                # name -> overrides | "scratch" | "not_available"
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
    extra: tuple[str, ...] = field(default=())   # --set of the command line, over everything

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

    def encoder_for(self, method: str, seed: int) -> PretrainRun | None:
        if self.variants.get(method) == "scratch":
            return None
        return PretrainRun(method, seed if seed in self.pretrain_seeds else self.pretrain_seeds[0])

    def finetune_runs(self) -> list[FinetuneRun]:
        runs: dict[str, FinetuneRun] = {}
        for g in self.grids:
            for corpus in g.corpora:
                for method in g.methods:
                    if method in self.unavailable:
                        continue
                    for mode in (("scratch",) if self.variants[method] == "scratch" else g.modes):
                        for leads in g.leads:
                            for fraction in g.fractions:
                                for seed in g.seeds:
                                    run = FinetuneRun(method, corpus, mode, leads, fraction, seed,
                                                      self.encoder_for(method, seed))
                                    runs.setdefault(run.name, run)
        return list(runs.values())

    @property
    def methods(self) -> list[str]:
        """Every downstream method, in first-seen order (the tables' rows)."""
        return list(dict.fromkeys(m for g in self.grids for m in g.methods))

    def pretrain_overrides(self, run: PretrainRun) -> list[str]:
        cell = [f"{k}={v}" for k, v in run.params]
        # a mask-rate cell is judged by its probe too (the cheap mode the figure compares against)
        probe = ["train.eval_every_epochs=1"] if run.params else []
        label = f"{run.variant} ({run.cell})" if run.params else run.variant
        return [*self.base, *self.variants[run.variant], *self.pretrain_set, *cell, *probe,
                f"train.seed={run.seed}", f"train.variant={label}", *self.extra]

    def finetune_overrides(self, run: FinetuneRun, more: list[str] | tuple[str, ...] = ()) -> list[str]:
        """The run's overrides; `more` (its corpus and encoder) before the command line's --set."""
        from coreecg.train.finetuning import parse_leads

        leads = parse_leads(run.leads)
        method = f"{run.method} ({run.encoder.cell})" if run.encoder and run.encoder.params else run.method
        out = [*self.base, *self.downstream_set, f"finetune.mode={run.mode}", f"finetune.leads=[{','.join(leads)}]",
               f"finetune.train_fraction={run.fraction}", f"train.seed={run.seed}", f"finetune.method={method}",
               f"finetune.dataset={run.corpus}"]
        return [*out, *more, *self.extra]

    def report_overrides(self) -> list[str]:
        return [*self.base, *self.report_set, *self.extra]


# ---------------------------------------------------------------------------- loading


def _list(path: Path, where: str, value: Any, kind: type | tuple, default: Any = None) -> list:
    if value is None:
        if default is None:
            raise StudyError(f"{path}: {where} is required")
        return list(default)
    if not isinstance(value, list) or not value or not all(isinstance(v, kind) and not isinstance(v, bool)
                                                           for v in value):
        raise StudyError(f"{path}: {where} must be a non-empty list of {getattr(kind, '__name__', kind)}, "
                         f"got {value!r}")
    return list(value)


def _overrides(path: Path, where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        raise StudyError(f"{path}: {where} must be a list of 'a.b=c' overrides, got {value!r}")
    return tuple(value)


def _keys(path: Path, where: str, data: Any, allowed: set[str]) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise StudyError(f"{path}: {where} must be a mapping")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise StudyError(f"{path}: unknown key(s) {', '.join(f'{where}.{k}' if where else k for k in unknown)}; "
                         f"allowed: {', '.join(sorted(allowed))}")
    return data


def _expand(path: Path, value: str) -> Path:
    """~ and $VARS (the driver's environment: shared storage on a cluster, e.g. ray job submit
    --runtime-env-json '{"env_vars": {"CORPORA": "/mnt/shared/corpora"}}'); an unset one is an error."""
    expanded = os.path.expandvars(str(value))
    if "$" in expanded:
        raise StudyError(f"{path}: {value!r}: environment variable not set")
    return Path(expanded).expanduser()


def _relative(path: Path, value: str) -> str:
    p = _expand(path, value)
    return str(p if p.is_absolute() else (path.parent / p).resolve())


def _absolute_paths(overrides: tuple[str, ...], folder: Path, path: Path) -> list[str]:
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        if key.strip() in PATH_KEYS and value.strip():
            p = _expand(path, value.strip())
            o = f"{key.strip()}={p if p.is_absolute() else (folder / p).resolve()}"
        out.append(o)
    return out


def _config(path: Path, where: str, config_file: str | None, overrides: list[str]):
    try:
        return load_config(config_file, overrides)
    except (ConfigError, FileNotFoundError, yaml.YAMLError) as e:
        raise StudyError(f"{path}: {where}: {e}") from None


def load_study(path: str | Path, extra: list[str] | tuple[str, ...] = ()) -> Study:
    """Read and validate a study file (every run's config is built once here)."""
    from coreecg.data.sources import SOURCES
    from coreecg.train.finetuning import FinetuneError, parse_leads
    from coreecg.tune.spaces import NOT_AVAILABLE, SCRATCH, SpaceError, load_space

    path = Path(path).resolve()
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise StudyError(f"{path}: cannot read: {e}") from None
    data = _keys(path, "", data, TOP_KEYS)
    pre = _keys(path, "pretrain", data.get("pretrain"), SECTION_KEYS["pretrain"])
    down = _keys(path, "downstream", data.get("downstream"), SECTION_KEYS["downstream"])
    rep = _keys(path, "report", data.get("report"), SECTION_KEYS["report"])
    config_file = _relative(path, data["config"]) if data.get("config") else None
    # Data paths: in the study's `set` relative to the study file, on the command line and in
    # the config to the current folder; trials run elsewhere (and on other nodes), so absolute.
    base = tuple(_absolute_paths(_overrides(path, "set", data.get("set")), path.parent, path))
    extra = tuple(_absolute_paths(tuple(extra), Path.cwd(), path))
    cfg = _config(path, "config + set + --set", config_file, [*base, *extra])
    given = {o.partition("=")[0].strip() for o in (*base, *extra)}
    extra += tuple(f"{key}={Path(getattr(cfg.data, key[5:])).expanduser().resolve()}" for key in PATH_KEYS
                   if key not in given and getattr(cfg.data, key[5:]))

    if not data.get("variants"):
        raise StudyError(f"{path}: variants (a tune_spaces variants file) is required")
    try:
        space = load_space(_relative(path, data["variants"]), config_file, [*base, *extra])
    except SpaceError as e:
        raise StudyError(f"{path}: variants: {e}") from None
    if not space.variants:
        raise StudyError(f"{path}: variants: {space.path} defines no variants")

    def known(where: str, names: list[str]) -> None:
        unknown = [n for n in names if n not in space.variants]
        if unknown:
            raise StudyError(f"{path}: {where}: unknown variant(s) {unknown}; {space.path.name} has "
                             f"{list(space.variants)}")

    pretrain_methods = _list(path, "pretrain.methods", pre.get("methods"), str, [])
    known("pretrain.methods", pretrain_methods)
    for m in pretrain_methods:
        if space.variants[m] in (SCRATCH, NOT_AVAILABLE):
            raise StudyError(f"{path}: pretrain.methods: {m!r} is {space.variants[m]!r} and has no pretraining")
    pretrain_seeds = _list(path, "pretrain.seeds", pre.get("seeds"), int, [0])
    pretrain_set = _overrides(path, "pretrain.set", pre.get("set"))

    corpora = []
    for name, spec in (_keys(path, "downstream.corpora", down.get("corpora"), set(down.get("corpora") or {}))).items():
        spec = _keys(path, f"downstream.corpora.{name}", spec, CORPUS_KEYS)
        if bool(spec.get("path")) == bool(spec.get("source")):
            raise StudyError(f"{path}: downstream.corpora.{name}: give either path (a built corpus) or "
                             "source + input (raw records to build one from)")
        if spec.get("source"):
            if spec["source"] not in SOURCES:
                raise StudyError(f"{path}: downstream.corpora.{name}: unknown source {spec['source']!r}; "
                                 f"known: {', '.join(sorted(SOURCES))}")
            if not spec.get("input") or not Path(_relative(path, spec["input"])).is_dir():
                raise StudyError(f"{path}: downstream.corpora.{name}: input folder "
                                 f"{spec.get('input') and _relative(path, spec['input'])!r} does not exist")
        corpora.append(CorpusSpec(str(name), _relative(path, spec["path"]) if spec.get("path") else "",
                                  str(spec.get("source") or ""),
                                  _relative(path, spec["input"]) if spec.get("input") else "",
                                  _overrides(path, f"downstream.corpora.{name}.set", spec.get("set"))))
    has_downstream = bool(corpora)
    default_methods = [*(n for n, v in space.variants.items() if v == SCRATCH), *pretrain_methods]

    def grid(name: str, fields: dict) -> Grid:
        w = "downstream" if name == "" else f"downstream.grids.{name}"
        get = lambda key: fields[key] if key in fields else down.get(key)   # noqa: E731
        names = [c.name for c in corpora]
        grid_corpora = _list(path, f"{w}.corpora", fields.get("corpora"), str, names)
        if [c for c in grid_corpora if c not in names]:
            raise StudyError(f"{path}: {w}.corpora: unknown corpus {[c for c in grid_corpora if c not in names]}; "
                             f"downstream.corpora has {names}")
        methods = _list(path, f"{w}.methods", get("methods"), str, default_methods)
        known(f"{w}.methods", methods)
        for m in methods:
            if space.variants[m] not in (SCRATCH, NOT_AVAILABLE) and m not in pretrain_methods:
                raise StudyError(f"{path}: {w}.methods: {m!r} is not pretrained here (add it to pretrain.methods)")
        modes = _list(path, f"{w}.modes", get("modes"), str, ["finetune"])
        bad = [m for m in modes if m not in MODES]
        if bad:
            raise StudyError(f"{path}: {w}.modes: unknown mode(s) {bad}; modes are {MODES} (the supervised "
                             "baseline is a `scratch` variant among the methods)")
        leads = [str(x) for x in _list(path, f"{w}.leads", get("leads"), (str, int), ["12"])]
        for x in leads:
            try:
                parse_leads(x)
            except FinetuneError as e:
                raise StudyError(f"{path}: {w}.leads: {e}") from None
        fractions = [float(f) for f in _list(path, f"{w}.fractions", get("fractions"), (int, float), [1.0])]
        if not all(0 < f <= 1 for f in fractions):
            raise StudyError(f"{path}: {w}.fractions must lie in (0, 1], got {fractions}")
        seeds = _list(path, f"{w}.seeds", get("seeds"), int, [0])
        return Grid(name or "downstream", tuple(grid_corpora), tuple(methods), tuple(modes), tuple(leads),
                    tuple(fractions), tuple(seeds))

    grids: list[Grid] = []
    if has_downstream:
        named = down.get("grids")
        if named is None:
            grids.append(grid("", {}))
        else:
            if not isinstance(named, dict) or not named:
                raise StudyError(f"{path}: downstream.grids must be a mapping of grid name -> fields")
            for name, fields in named.items():
                grids.append(grid(str(name), _keys(path, f"downstream.grids.{name}", fields or {}, GRID_KEYS)))
    downstream_set = _overrides(path, "downstream.set", down.get("set"))

    tables_allowed = [*BUILT_IN_TABLES, *(t for t in space.tables if t not in BUILT_IN_TABLES)]
    tables = _list(path, "report.tables", rep.get("tables"), str, BUILT_IN_TABLES if has_downstream else [])
    if [t for t in tables if t not in tables_allowed]:
        raise StudyError(f"{path}: report.tables: unknown table(s) {[t for t in tables if t not in tables_allowed]}; "
                         f"known: {tables_allowed}")
    figures = _list(path, "report.figures", rep.get("figures"), str, [])
    if [f for f in figures if f not in FIGURES]:
        raise StudyError(f"{path}: report.figures: unknown figure(s) {[f for f in figures if f not in FIGURES]}; "
                         f"known: {list(FIGURES)}")
    report_set = _overrides(path, "report.set", rep.get("set"))
    mask_rates = None
    if data.get("mask_rates") is not None:
        mr = _keys(path, "mask_rates", data["mask_rates"], SECTION_KEYS["mask_rates"])
        if not mr.get("space"):
            raise StudyError(f"{path}: mask_rates.space (a grid file, e.g. tune_spaces/mask_rates.yaml) is required")
        variant = str(mr.get("variant") or "CoRe-ECG")
        known("mask_rates.variant", [variant])
        try:
            if not isinstance(space.variants[variant], list):
                raise StudyError(f"{path}: mask_rates.variant {variant!r} has no pretraining")
            grid_space = load_space(_relative(path, mr["space"]), config_file, [*base, *space.variants[variant]])
        except SpaceError as e:
            raise StudyError(f"{path}: mask_rates.space: {e}") from None
        if len(grid_space.grid) != 2:
            raise StudyError(f"{path}: mask_rates.space: a mask-rate grid needs exactly two grid keys, "
                             f"got {list(grid_space.grid)}")
        names = [c.name for c in corpora]
        mr_corpora = _list(path, "mask_rates.corpora", mr.get("corpora"), str, names)
        if not mr_corpora or [c for c in mr_corpora if c not in names]:
            raise StudyError(f"{path}: mask_rates.corpora: {mr_corpora} must name downstream.corpora ({names})")
        keys = tuple(grid_space.grid)
        mask_rates = MaskRates(variant, keys, tuple(tuple(float(v) for v in grid_space.grid[k]) for k in keys),
                               tuple(mr_corpora), tuple(_list(path, "mask_rates.seeds", mr.get("seeds"), int, [0])))
    if "mask_rates" in figures and mask_rates is None:
        raise StudyError(f"{path}: report.figures names mask_rates but the study has no mask_rates section")
    if not pretrain_methods and not has_downstream:
        raise StudyError(f"{path}: nothing to run (no pretrain.methods and no downstream.corpora)")

    study = Study(path=path, name=str(data.get("name") or path.stem), config_file=config_file, base=base,
                  variants=dict(space.variants), unavailable=dict(space.unavailable),
                  method_tables={k: list(v) for k, v in space.tables.items()},
                  pretrain_methods=tuple(pretrain_methods), pretrain_seeds=tuple(pretrain_seeds),
                  pretrain_set=pretrain_set, corpora=tuple(corpora), grids=tuple(grids),
                  downstream_set=downstream_set, tables=tuple(tables), figures=tuple(figures),
                  report_set=report_set, mask_rates=mask_rates, extra=extra)
    for run in study.pretrain_runs():        # every run's config, once, before Ray
        _config(path, f"pretraining {run.variant!r} (seed {run.seed})", config_file, study.pretrain_overrides(run))
    for run in [*study.finetune_runs(), *study.mask_rate_runs()]:
        _config(path, f"fine-tuning {run.method!r} on {run.corpus} ({run.mode}, leads {run.leads}, "
                      f"fraction {run.fraction}, seed {run.seed})", config_file, study.finetune_overrides(run))
    _config(path, "report.set", config_file, study.report_overrides())
    return study
