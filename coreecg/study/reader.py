"""A study file read: `load_study` (a file) or `study_from_dict` (the same mapping made in code)
-> a `Study` (coreecg.study.plan), every name checked against the variants file and the
registered tables, every path absolute, every run's config built and each table's rows checked
for one protocol (coreecg.study.checks), all before any Ray starts. An error is a StudyError
"<file>: <dotted.key>: <reason>" (the schema: coreecg.study.schema).
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from coreecg.config import import_plugins
from coreecg.data.leads import LeadSetError, parse_lead_set
from coreecg.eval.fairness import Allowance
from coreecg.eval.tables import TableError, TableInputs, default_tables, known_tables, table_for
from coreecg.override_paths import PATH_KEYS, PathError, absolute_overrides, absolute_path
from coreecg.study.checks import check_fair_tables, check_run_configs, config_or_error
from coreecg.study.plan import CorpusSpec, Grid, MaskRates, PretrainCorpus, Study
from coreecg.study.schema import CorpusEntry, GridEntry, ReportSection, StudyError, StudyFile
from coreecg.tune.spaces import NO_PRETRAINING, NOT_AVAILABLE, SCRATCH, Space, SpaceError, load_space
from coreecg.typed import load, read_yaml

# Lazy imports: the source registry (every reader: about 1 s), and the checkpoint store and the loader
# (torch), where they are asked: reading a study file stays light and torch-free.


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
    study = StudyReader(origin, spec, tuple(extra)).study()
    check_fair_tables(study, check_run_configs(study))
    return study


class StudyReader:
    """A `StudyFile` made a `Study`: paths resolved, every name checked against the variants file."""

    def __init__(self, path: Path, spec: StudyFile, extra: tuple[str, ...]):
        self.path, self.spec = path, spec
        self.contracts: dict[str, str] = {}     # given encoder -> its published family's contract (encoders())
        self.config_file = self.relative("config", spec.config) if spec.config else None
        # Data paths: in the study's `set` relative to the study file, on the command line and in
        # the config to the current folder; trials run elsewhere (and on other nodes), so absolute.
        self.base = self.absolute_paths("set", spec.set, path.parent)
        extra = self.absolute_paths("--set", extra, Path.cwd())
        self.given_extra = extra
        cfg = config_or_error(path, "config + set + --set", self.config_file, [*self.base, *extra])
        import_plugins(cfg.plugins, "plugins")      # before report.tables: a plugin may register a table
        given = {o.partition("=")[0].strip() for o in (*self.base, *extra)}
        own = [f"{key}={_text(getattr(cfg.data, key[5:]))}" for key in PATH_KEYS
               if key not in given and getattr(cfg.data, key[5:])]
        self.extra = extra + self.absolute_paths("config", tuple(own), Path.cwd())
        self.space = self.variants_file()

    def error(self, key: str, reason: str) -> StudyError:
        return StudyError(f"{self.path}: {key}: {reason}")

    def relative(self, key: str, value: str, folder: Path | None = None) -> str:
        """A path, absolute: ~ and $VARS expanded (the driver's environment: shared storage on a
        cluster, e.g. ray job submit --runtime-env-json '{"env_vars": {"CORPORA": "/mnt/shared/
        corpora"}}'), a relative one from `folder` (default: the study file's)."""
        try:
            return absolute_path(value, folder or self.path.parent)
        except PathError as e:
            raise self.error(key, str(e)) from None

    def absolute_paths(self, key: str, overrides: tuple[str, ...], folder: Path) -> tuple[str, ...]:
        """The overrides with their data.* paths absolute (relative ones from `folder`)."""
        try:
            return tuple(absolute_overrides(overrides, folder))
        except PathError as e:
            raise self.error(key, str(e)) from None

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
        unknown = [n for n in names
                   if n not in self.space.variants and not (encoders and n in self.spec.downstream.encoders)]
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
        from coreecg.model.published.registry import release_hint

        out = {}
        for name, value in self.spec.downstream.encoders.items():
            key = f"downstream.encoders.{name}"
            if name in self.space.variants:
                raise self.error(key, f"{name!r} is also a variant of {self.space.path.name}; give the encoder "
                                      "another name")
            path = self.relative(key, value)
            try:
                pre = open_source(path, kind="encoder").config.data.preprocess
                if pre.contract:            # a published family fed its own input contract
                    self.contracts[name] = pre.contract
            except (CheckpointError, OSError) as e:
                hint = release_hint(path) if not Path(path).exists() else ""
                raise self.error(key, str(e) + (f"; {hint}" if hint else "")) from None
            out[name] = path
        return out

    def tables(self, has_downstream: bool) -> tuple[str, ...]:
        """report.tables: registered tables (a plugin's too) and the variants file's own; default:
        the registered default tables when the study fine-tunes."""
        tables = self.spec.report.tables
        tables = tuple(tables if tables is not None else (default_tables() if has_downstream else ()))
        known = known_tables(list(self.space.tables))
        if [t for t in tables if t not in known]:
            raise self.error("report.tables", f"unknown table(s) {[t for t in tables if t not in known]}; "
                                              f"known: {known}")
        return tables

    def table_checks(self, tables: tuple[str, ...]) -> tuple[str, ...]:
        """report.published, absolute; then each table's own check of the study (the benchmark
        table reads those files now). A report key given without a table that reads it
        (RegisteredTable.study_keys) is an error."""
        report = self.spec.report
        for key in (f.name for f in fields(ReportSection)):
            readers = [name for name in known_tables() if key in table_for(name).study_keys]
            if readers and getattr(report, key) and not set(readers) & set(tables):
                raise self.error(f"report.{key}", f"read by the {' or '.join(map(repr, readers))} table; add it to "
                                                  "report.tables")
        published = tuple(self.relative("report.published", value) for value in report.published)
        inputs = TableInputs(rows=self.space.tables, unavailable=self.space.unavailable, allow=self.space.allow,
                             published=published)
        for name in tables:
            check = table_for(name, list(self.space.tables)).check
            try:
                if check is not None:
                    check(inputs)
            except TableError as e:
                raise self.error(e.key, e.reason) from None
        return published

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
                     published=self.table_checks(tables),
                     extra=self.extra, pretrain_corpora=pretrain_corpora,
                     allow=(*space.allow,
                            *(Allowance((name,), ("model.*", "encoders.*"),
                                        f"{name} is a given encoder ({path}): its architecture is its own")
                              for name, path in encoders.items()),
                            # one allowance for every contract-fed row: a difference is declared when one
                            # allowance covers a whole side of it (coreecg.eval.fairness._judge)
                            *((Allowance(tuple(self.contracts), CONTRACT_KEYS,
                                         "each published encoder is fed its own input contract ("
                                         + ", ".join(f"{n}: {c}" for n, c in self.contracts.items())
                                         + "): the downstream corpus built under it, its leads and window "
                                           "(docs/published_encoders.md)"),) if self.contracts else ())))


# What a published encoder's own input contract changes in its fine-tuning runs (a declared difference).
CONTRACT_KEYS = ("data.corpus", "data.preprocess.*", "data.crop_samples", "finetune.leads", "finetune.eval_crops")


def _text(value: str | tuple[str, ...]) -> str:
    """A config's data path as an override's value: a mixture's list as a JSON list."""
    return json.dumps(list(value)) if isinstance(value, tuple) else str(value)
