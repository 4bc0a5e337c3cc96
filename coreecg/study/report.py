"""A study's report: its tables (coreecg.eval.report: Markdown, CSV, booktabs LaTeX, paired
differences to the reference method) and figures, and `report/README.md`, an index naming each
table and figure with the runs behind it."""
from __future__ import annotations

import logging
from math import isclose
from pathlib import Path

from coreecg.config import load_config
from coreecg.eval.report import TABLE_MODES, TABLES, RunError, load_run, write_report
from coreecg.study.runner import DONE, run_dir
from coreecg.study.spec import Study

log = logging.getLogger(__name__)


def finished_runs(study: Study, output: Path, phase: str) -> dict[str, Path]:
    runs = study.pretrain_runs() if phase == "pretrain" else study.finetune_runs()
    return {r.name: run_dir(output, phase, r.name) for r in runs
            if (run_dir(output, phase, r.name) / DONE[phase]).is_file()}


def _members(table: str, methods: list[str] | None, runs: dict[str, object]) -> list[str]:
    """The run folders (names) a table's cells are computed from."""
    spec = next((t for t in TABLES if t.name == table), TABLES[0])
    out = []
    for name, run in runs.items():
        if run.mode not in TABLE_MODES or (methods is not None and run.method not in methods):
            continue
        if any(run.leads == leads and isclose(run.train_fraction, frac) for leads, frac, _ in spec.variants):
            out.append(name)
    return out


def write_study_report(study: Study, output: str | Path) -> Path:
    """Tables and figures of every finished run into output/report/; -> report/README.md."""
    output = Path(output).resolve()
    report_dir = output / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(study.config_file, study.report_overrides())
    finetunes = finished_runs(study, output, "finetune")
    runs = {}
    for name, folder in finetunes.items():
        try:
            runs[name] = load_run(folder)
        except RunError as e:           # recorded in the index; the other tables still come
            log.warning("%s", e)
    lines = [f"# Study {study.name}", "", f"Study file: `{study.path}`; runs: `{output / 'runs.csv'}`.", "",
             f"{len(finished_runs(study, output, 'pretrain'))} of {len(study.pretrain_runs())} pretraining and "
             f"{len(runs)} of {len(study.finetune_runs())} fine-tuning runs finished.", ""]
    if runs:
        rows = study.methods
        method_tables = {t: [m for m in study.method_tables[t] if m in rows or m in study.unavailable]
                         for t in study.tables if t in study.method_tables}
        method_tables = {t: m for t, m in method_tables.items() if m}
        write_report([r.path for r in runs.values()], report_dir / "tables",
                               method_tables, study.unavailable, report=cfg.report)
        lines += ["## Tables", "",
                  f"Markdown, CSV and LaTeX (booktabs) in `tables/`; differences to {cfg.report.reference} with "
                  f"{cfg.report.level:.0%} paired bootstrap intervals ({cfg.report.bootstrap_resamples} resamples "
                  f"over test patients and seeds); F1: {cfg.report.f1} (docs/evaluation.md).", ""]
        for table in study.tables:
            file = table if table in ("comparison", "lead_reduction", "train_fraction") else f"ablation_{table}"
            members = _members(table if file == table else "comparison",
                               method_tables.get(table) if table in method_tables else None, runs)
            lines.append(f"- **{table}**: [`tables/{file}.md`](tables/{file}.md), `tables/{file}.csv`, "
                         f"`tables/{file}.tex`; {len(members)} run(s): "
                         + ", ".join(f"`{m}`" for m in sorted(members)))
        lines.append("")
    else:
        lines += ["No fine-tuning run finished: no tables.", ""]
    index = report_dir / "README.md"
    index.write_text("\n".join(lines) + "\n")
    return index
