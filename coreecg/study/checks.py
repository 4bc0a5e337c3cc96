"""A study's checks before Ray: every run's config built once (an unknown key or a bad value is a
StudyError naming the run), and every table's rows trained under one protocol
(coreecg/eval/fairness.py), each table as its registration says (coreecg.eval.tables: whether
its rows' pretraining is compared, which differences its rows may have by design).
"""
from __future__ import annotations

from pathlib import Path

from coreecg.config import Config, ConfigError, load_config
from coreecg.eval.tables import table_for
from coreecg.study.plan import Study
from coreecg.study.schema import StudyError
from coreecg.eval.fairness import Entry, FINETUNING, PRETRAINING, UnfairTableError, check_table, finetune_cell

# Lazy imports: the loader (torch), where an encoder is opened: the checks run before Ray, torch-free.


def config_or_error(origin: Path, where: str, config_file: str | None, overrides: list[str]) -> Config:
    """load_config, its ConfigError a StudyError naming the study file and `where`."""
    try:
        return load_config(config_file, overrides)
    except ConfigError as e:
        raise StudyError(f"{origin}: {where}: {e}") from None


def check_run_configs(study: Study) -> dict[str, dict]:
    """Every run's config, once, before Ray: StudyError naming the file and the run. -> run name
    -> its config as a plain dict (what the fairness check compares)."""
    out = {}
    for run in study.pretrain_runs():
        overrides = study.pretrain_overrides(run, study.planned_pretrain_corpora())
        out[run.name] = config_or_error(study.path, f"pretraining {run.variant!r} (seed {run.seed})", study.config_file,
                                        overrides).to_dict()
    for run in [*study.finetune_runs(), *study.mask_rate_runs()]:
        where = (f"fine-tuning {run.method!r} on {run.corpus} ({run.mode}, leads {run.leads}, fraction "
                 f"{run.fraction}, seed {run.seed})")
        out[run.name] = config_or_error(study.path, where, study.config_file, study.finetune_overrides(run)).to_dict()
    config_or_error(study.path, "report.set", study.config_file, study.report_overrides())
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


def check_fair_tables(study: Study, configs: dict[str, dict]) -> None:
    """Every table's rows differ only in what defines their method (coreecg/eval/fairness.py),
    before Ray starts: StudyError naming the table, rows and keys otherwise. A table that compares
    encoders (its registration: compares_pretraining=False) leaves their pretraining out."""
    for table, rows in study.table_rows().items():
        kind = table_for(table, list(study.method_tables))
        pretraining = kind.compares_pretraining
        entries = [Entry(r.variant, PRETRAINING, "", configs[r.name]) for r in study.pretrain_runs()
                   if r.variant in rows and not r.params and pretraining]
        entries += [Entry(r.method, FINETUNING, finetune_cell(r.corpus, r.mode, r.leads, r.fraction), configs[r.name])
                    for r in study.finetune_runs() if r.method in rows]
        if pretraining:     # a given coreecg encoder's pretraining is compared as the report will
            entries += [Entry(m, PRETRAINING, "", cfg) for m, cfg in _given_pretraining(study).items() if m in rows]
        own = kind.allowances(rows) if kind.allowances else []
        try:
            check_table(table, entries, [*study.allow, *own])
        except UnfairTableError as e:
            raise StudyError(f"{study.path}: {e}") from None
