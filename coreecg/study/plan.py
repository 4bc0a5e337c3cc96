"""A validated study (coreecg.study.reader makes one from a study file): its corpora, grids and
every run it holds (pretraining, fine-tuning, the mask-rate figure's cells), each with its
overrides, and each table's rows. Plain frozen data: the runner (coreecg.study.runner) and the
report (coreecg.study.summary) read it, nothing here reads a file.

A downstream seed s fine-tunes the encoder pretrained with seed s when the study pretrains one,
else the one of the first pretraining seed; a `downstream.encoders` entry is one encoder for every
seed. A run two grids share runs once (with the same `set`, else a StudyError).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coreecg.data.leads import parse_lead_set
from coreecg.eval.fairness import Allowance
from coreecg.eval.tables import known_tables
from coreecg.study.schema import StudyError
from coreecg.tune.spaces import RANDOM, SCRATCH


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
        out = [*self.base, *self.downstream_set, *run.set, f"finetune.mode={run.mode}",
               f"finetune.leads=[{','.join(leads)}]",
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
        for t in set(out) & set(known_tables()):    # given encoders join the registered tables (not an ablation), last
            out[t] += [m for m in self.encoders if m in runnable and m not in out[t]]
        return out
