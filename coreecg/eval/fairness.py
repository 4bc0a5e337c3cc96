"""Fair tables: the rows of a table may differ only in what defines their method.

A table compares methods; a difference between two rows is a claim about the methods only when
everything else was the same: the encoder, the pretraining data and budget (corpus, epochs,
batch, optimiser), the negatives pool, workers x per-worker batch, the fine-tuning protocol and
the seeds. `check_table` compares the configs behind each row and

- ignores what defines a method (`defining_keys`: which method and its options, the variant's
  name and the fine-tuning protocol (GENERIC_DEFINING), plus what each registered method declares
  with `register_method(defining=...)`; a method's own section holds its defining options, e.g.
  CoRe-ECG's masking, FDA, loss weights, decoders, projection head and teacher EMA under
  methods.core) and what only bookkeeps a run
  (BOOKKEEPING: names, paths, logging, checkpoint cadence, speed options that do not change the
  arithmetic's result beyond float rounding);
- turns a difference declared in the variants file (`allow:` entries: rows, keys, reason) into
  a footnote of the table;
- raises UnfairTableError naming the table, the rows and the keys for any other difference.

    allow:                                   # tune_spaces/<variants>.yaml
      - variants: [MoCo V3]
        keys: [optim.lr]                     # a dotted key, or a section prefix such as optim.*
        reason: MoCo v3's own learning rate (its paper, Table 1)

Configs come in as plain nested dicts (`Config.to_dict()` or a run folder's config.yaml), one
`Entry` per run: a study checks the configs it is about to run (before Ray starts), the report
the configs of the runs that finished.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from coreecg.config import ConfigError, method_specs
from coreecg.config.loading import moved_to_new_places

# Lazy imports: the checkpoint store and the loader (torch), where an encoder's pretraining config is read:
# the report's tables and a study's checks import this module torch-free.

# Keys that define any method: rows are meant to differ here. Each registered method adds its own
# (MethodSpec.defining): "a.b", or a prefix "a.*" / "a.b_*".
GENERIC_DEFINING = ("pretrain.*", "methods.*", "train.variant", "finetune.method", "finetune.mode",
                    "finetune.encoder")
# Keys that name, place, log or speed up a run without changing what it computes.
BOOKKEEPING_PREFIXES = ("report.", "data.probe_", "train.tracking")
BOOKKEEPING = frozenset({
    "train.name", "train.storage_path", "train.mirror_uri", "train.log_every", "train.progress_every_s",
    "train.eval_every_epochs", "train.figures", "train.checkpoint_every_steps", "train.keep_checkpoints",
    "train.max_failures", "train.device", "train.cpus_per_worker", "train.host_memory_cache",
    "train.activation_checkpointing", "train.compile", "train.compile_mode", "data.cache_dir",
    "data.cache_in_memory_gb",
    "finetune.eval_batch_size", "finetune.bootstrap_resamples", "finetune.tsne_max_points",
    "finetune.dataset", "finetune.cache_features", "train.seed"})       # seeds are compared as sets per row (SEEDS)
SEEDS = "train.seed"
PRETRAINING, FINETUNING = "pretraining", "fine-tuning"


class UnfairTableError(ValueError):
    """Rows of a table trained under different protocols; the message names table, rows and keys."""


@dataclass(frozen=True)
class Allowance:
    """A declared difference: rows `variants` may differ from the others in `keys` (dotted keys
    or `section.*` prefixes), for `reason` (printed as the table's footnote)."""

    variants: tuple[str, ...]
    keys: tuple[str, ...]
    reason: str

    def covers(self, row: str, key: str) -> bool:
        return row in self.variants and any(key == k or (k.endswith(".*") and key.startswith(k[:-1]))
                                            for k in self.keys)


@dataclass(frozen=True)
class Entry:
    """One run behind a table row: its method (the row), which comparison it is part of (`phase`
    and `cell`: runs are compared within one cell, e.g. "ptbxl, 12 leads, 100 %"), its config."""

    method: str
    phase: str                  # PRETRAINING | FINETUNING
    cell: str
    config: Mapping[str, Any]


def finetune_cell(dataset: str, mode: str, leads: str, fraction: float) -> str:
    """The table cell a fine-tuning run fills (the supervised baseline's `scratch` sits in the
    fine-tuning column)."""
    column = "finetune" if mode == "scratch" else mode
    return f"{dataset}, {column}, {leads} leads, {fraction:.0%} of the training data"


def run_entries(runs: Sequence[Any]) -> dict[Path, tuple[list[Entry], list[str]]]:
    """The entries behind finished fine-tuning runs (`coreecg.eval.report.Run`: path, method,
    dataset, mode, leads, train_fraction, record): run folder -> (its config.yaml as a fine-tuning
    entry and, where it has an encoder, the pretraining config that encoder carries; notes on what
    could not be checked). Each encoder is opened once."""
    from coreecg.checkpoints import CheckpointError
    from coreecg.loading import open_source

    out, encoders = {}, {}
    for run in runs:
        entries, notes = [], []
        cell = finetune_cell(run.dataset, run.mode, run.leads, run.train_fraction)
        try:
            saved = yaml.safe_load((Path(run.path) / "config.yaml").read_text())
            # a run folder written before a key moved: its keys at their places now, as loading reads them
            entries.append(Entry(run.method, FINETUNING, cell, moved_to_new_places(saved, str(run.path))))
        except (OSError, yaml.YAMLError, ConfigError) as e:
            notes.append(f"{run.path}: no readable config.yaml ({e}); its protocol is not checked")
        encoder = run.record.get("encoder")
        if encoder == "random":      # finetune.encoder=random: no pretraining config to compare
            encoder = None
        if encoder and encoder not in encoders:
            try:
                src = open_source(encoder, kind="encoder")
                encoders[encoder] = ((None, f"{run.method}: published {src.config.method_label} weights ({encoder}): "
                                            "pretrained elsewhere, its pretraining protocol is not compared")
                                     if src.entries.get("published") else (src.config.to_dict(), ""))
            except (CheckpointError, OSError, ValueError) as e:   # moved or unreadable: say so
                encoders[encoder] = (None, f"{run.method}: its encoder {encoder} cannot be opened ({e}); "
                                           "its pretraining protocol is not checked")
        if encoder:
            config, why = encoders[encoder]
            entries += [Entry(run.method, PRETRAINING, "", config)] if config is not None else []
            notes += [why] if why else []
        out[Path(run.path)] = (entries, notes)
    return out


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}; lists become tuples (comparable, hashable)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def defining_keys() -> tuple[frozenset[str], tuple[str, ...]]:
    """(exact keys, prefixes) that define a method: GENERIC_DEFINING and the union of every
    registered method's `defining` (read through the config's registry: plugins included once
    imported)."""
    entries = {*GENERIC_DEFINING, *(e for spec in method_specs().values() for e in spec.defining)}
    return (frozenset(e for e in entries if not e.endswith("*")),
            tuple(sorted(e[:-1] for e in entries if e.endswith("*"))))


def is_compared(key: str, defining: tuple[frozenset[str], tuple[str, ...]] | None = None) -> bool:
    """Whether rows must agree on `key` (it neither defines a method nor only bookkeeps);
    `defining`: `defining_keys()`, when the caller asks for many keys."""
    exact, prefixes = defining or defining_keys()
    return not (key in exact or key in BOOKKEEPING or key.startswith(prefixes)
                or key.startswith(BOOKKEEPING_PREFIXES))


def check_table(table: str, entries: Iterable[Entry], allow: Sequence[Allowance] = (), *,
                seeds: str = "strict") -> list[str]:
    """Compare the rows of `table` cell by cell. -> the table's footnotes (declared differences,
    and with seeds="note" rows whose seed sets differ). seeds="strict" (a study about to run):
    differing seed sets are a protocol difference like any other; "note" (the report on finished
    runs, where a failed run leaves a row short): a footnote, since the significance rule compares
    rows with different runs. UnfairTableError lists every undeclared difference."""
    groups: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    for e in entries:
        groups.setdefault((e.phase, e.cell), {}).setdefault(e.method, []).append(flatten(e.config))
    notes, errors = [], []
    for (phase, cell), rows in groups.items():
        where = f"{phase}{f' ({cell})' if cell else ''}"
        for key, values in _differences(rows, where, allow, notes, errors).items():
            _judge(key, values, where, allow, notes, errors)
        seed_sets = {m: tuple(sorted({c.get(SEEDS) for c in cs})) for m, cs in rows.items()}
        if len(set(seed_sets.values())) > 1:
            text = f"{where}: seeds differ: " + "; ".join(f"{m} {list(s)}" for m, s in seed_sets.items())
            (errors if seeds == "strict" else notes).append(text)
    if errors:
        raise UnfairTableError(f"table {table!r}: rows trained under different protocols (only what defines a "
                               "method may differ; declare any other difference in the variants file's allow: "
                               "with a reason):\n  " + "\n  ".join(errors))
    return list(dict.fromkeys(notes))


def _differences(rows: Mapping[str, list[dict[str, Any]]], where: str, allow: Sequence[Allowance],
                 notes: list[str], errors: list[str]) -> dict[str, dict[str, Any]]:
    """key -> {method: value} for every compared key on which the rows disagree. Every run of a
    row is compared, not only its first: runs of one row that disagree among themselves are judged
    here (a note when declared for that row, else an error line) and compared by their first."""
    defining = defining_keys()
    keys = sorted({k for cs in rows.values() for c in cs for k in c if is_compared(k, defining)})
    out = {}
    for key in keys:
        for method, cs in rows.items():
            seen = list(dict.fromkeys(repr(c.get(key, "<absent>")) for c in cs))
            if len(seen) > 1:
                text = f"{method}'s runs differ among themselves in {key} ({', '.join(seen)})"
                reasons = [a.reason for a in allow if a.covers(method, key)]
                (notes if reasons else errors).append(f"{text}: {reasons[0]}" if reasons else f"{where}: {text}")
        values = {m: cs[0].get(key, "<absent>") for m, cs in rows.items()}
        if len({repr(v) for v in values.values()}) > 1:
            out[key] = values
    return out


def _judge(key: str, values: Mapping[str, Any], where: str, allow: Sequence[Allowance],
           notes: list[str], errors: list[str]) -> None:
    """One differing key: a footnote when an allowance covers every row on one side of the
    difference (the rows off the most common value, or the rows on it), else an error line."""
    common = Counter(repr(v) for v in values.values()).most_common(1)[0][0]
    off = [m for m, v in values.items() if repr(v) != common]
    on = [m for m in values if m not in off]
    shown = ", ".join(f"{m}: {values[m]!r}" for m in values)
    for side in (off, on):
        reasons = [a.reason for a in allow if all(a.covers(m, key) for m in side)]
        if reasons:
            notes.append(f"{', '.join(side)} differ{'s' if len(side) == 1 else ''} in {key} ({shown}): "
                         f"{reasons[0]}")
            return
    errors.append(f"{where}: {', '.join(off)} differ{'s' if len(off) == 1 else ''} from {', '.join(on)} in {key} "
                  f"({shown})")
