"""A study's summary, its report folder: the tables (report.tables, each built and written as its
registration says: coreecg.eval.tables, coreecg.eval.report.write_tables), the figures, and
`report/README.md`, an index naming each table and figure with the runs behind it. Nothing here
names a table. (coreecg.eval.report writes tables from run folders; this module writes a study's.)"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from coreecg.config import load_config
from coreecg.data.corpus import load_manifest
from coreecg.eval.report import write_tables
from coreecg.eval.runs import Run, RunError, load_run
from coreecg.eval.tables import REFERENCE, TableInputs, known_tables, table_for
from coreecg.study.plan import Study
from coreecg.study.runner import run_dir
from coreecg.tune.trials import is_done
from coreecg.study.mask_rates import cell_result, probe_row, write_finetune_figures, write_probe_results

# Lazy imports: torch, the loader, the methods, the figures (matplotlib: the `ray` extra), where a report
# part is drawn: the study's checks import this module torch-free.

log = logging.getLogger(__name__)


def finished_runs(study: Study, output: Path, phase: str) -> dict[str, Path]:
    runs = study.pretrain_runs() if phase == "pretrain" else study.finetune_runs()
    return {r.name: run_dir(output, phase, r.name) for r in runs if is_done(run_dir(output, phase, r.name))}


def _pair(candidates: list[str], reference: str) -> list[str]:
    """The two methods a paired figure shows: ST-MEM-like against the reference (the paper's
    figures), else the first two candidates."""
    if "ST-MEM-like" in candidates and reference in candidates and reference != "ST-MEM-like":
        return ["ST-MEM-like", reference]
    return candidates[:2]


def reconstruction_figure(study: Study, output: Path, reference: str, seed: int) -> tuple[Path, list[str]] | None:
    """Two pretrained methods that reconstruct, side by side on the same validation windows of
    the pretraining corpus and under the same masks (the first method's), from each run's last
    checkpoint. -> (figure, runs) or None when fewer than one such run finished."""
    from coreecg.data.locate import training_corpus
    from coreecg.eval.figures import reconstruction_figure as draw
    from coreecg.eval.figures import save_figure
    from coreecg.checkpoints import latest_checkpoint
    from coreecg.loading import load_method
    from coreecg.methods import build_method
    from coreecg.train.pretraining import figure_windows

    finished = finished_runs(study, output, "pretrain")
    models, runs, windows = {}, [], None
    by_method: dict[str, str] = {}
    for r in study.pretrain_runs():          # each method's first finished seed; never a mask-rate cell
        if r.name in finished and not r.params:
            by_method.setdefault(r.variant, r.name)
    loaded = {}
    for method, name in by_method.items():
        if latest_checkpoint(finished[name]) is None:
            continue
        run = load_method(finished[name], build_method)       # its latest checkpoint
        if run.model.can_reconstruct:
            loaded[method] = (run.model, run.config, name)
    chosen = _pair(list(loaded), reference)
    if not chosen:
        return None
    for method in chosen:
        model, config, name = loaded[method]
        models[method] = model
        runs.append(name)
        if windows is None:
            windows = figure_windows(training_corpus(config), config.model.input_samples)
    fig = draw(models, windows, seed=seed,
               title=" vs ".join(chosen) + ": original (blue), reconstruction of masked patches (red) on the "
                     "same windows and masks; grey: masked, hatched: dropped")
    return save_figure(fig, output / "report" / "figures" / "reconstruction.png"), runs


def classifier_features(run: Path) -> tuple[np.ndarray, np.ndarray, list[str], bool]:
    """A fine-tuning run's selected classifier (best.pt) on its corpus's test split: pooled
    features (records, D) averaged over crops and windows, multi-hot labels, class names, multi-label."""
    import torch

    from coreecg.eval.downstream import load_split, predict, to_records
    from coreecg.loading import load_finetuned

    tuned = load_finetuned(run / "best.pt")          # its class names and task travel with it (or metrics.json)
    model, config = tuned.model, tuned.config
    f = config.finetune
    split = load_split(config.data.corpus, "test")
    stored = list(load_manifest(config.data.corpus)["signal"]["leads"])
    probs, feats = predict(model, split.signal, [stored.index(x) for x in f.leads], config.data.crop_samples,
                           f.eval_crops, torch.device("cpu"), f.eval_batch_size)
    records = to_records(split, probs, feats)
    return records.features, records.y, list(tuned.class_names), bool(tuned.multilabel)


def tsne_figures(study: Study, output: Path, reference: str, seed: int) -> list[tuple[Path, list[str]]]:
    """Per downstream corpus: paired t-SNE panels of two fine-tuned encoders (12 leads, all
    training data, the first seed; fine-tuning mode first) on the same test records."""
    from coreecg.eval.figures import save_figure, tsne_panels

    finished = finished_runs(study, output, "finetune")
    out = []
    for corpus in study.corpora:
        for mode in ("finetune", "frozen", "linear"):
            cands = {r.method: r.name for r in study.finetune_runs()
                     if r.corpus == corpus.name and r.mode == mode and r.leads == "12" and r.fraction == 1.0
                     and r.name in finished and r.seed == min(g.seeds[0] for g in study.grids)}
            chosen = _pair(list(cands), reference)
            if len(chosen) == 2:
                break
        if not chosen:
            continue
        panels, y, names, multilabel = [], None, None, False
        for method in chosen:
            feats, y, names, multilabel = classifier_features(finished[cands[method]])
            panels.append((method, feats))
        fig = tsne_panels(panels, y, names, multilabel, seed=seed,
                          title=f"{' vs '.join(chosen)}: {'fine-tuned' if mode == 'finetune' else 'linear-probed'} "
                                f"encoders on the {corpus.name} test records")
        out.append((save_figure(fig, output / "report" / "figures" / f"tsne_{corpus.name}.png"),
                    [cands[m] for m in chosen]))
    return out


def mask_rate_figures(study: Study, output: Path) -> list[tuple[Path, list[str]]]:
    """The paper's mask-rate figure (coreecg.study.mask_rates): the cheap mode (every cell's
    final probe_auroc: probe_results.csv, heatmap.png) and, where cells were fine-tuned, F1 and
    AUROC heatmaps per dataset and the rank correlation between the two modes."""
    m = study.mask_rates
    x, y = m.keys
    probe_rows = [probe_row(run_dir(output, "pretrain", run.name), {x: run.params[0][1], y: run.params[1][1],
                                                                     "seed": run.seed})
                  for run in m.runs()]
    ft_rows = [cell_result(run_dir(output, "finetune", run.name),
                           {x: run.encoder.params[0][1], y: run.encoder.params[1][1], "seed": run.seed,
                            "dataset": run.corpus, "trial_id": run.encoder.name})
               for run in study.mask_rate_runs()]
    figures = output / "report" / "figures" / "mask_rates"
    figures.mkdir(parents=True, exist_ok=True)
    cells = [r.name for r in m.runs() if is_done(run_dir(output, "pretrain", r.name))]
    written = [(p, cells) for p in write_probe_results(probe_rows, x, y, figures)]
    if ft_rows:
        behind = [r.name for r in study.mask_rate_runs() if is_done(run_dir(output, "finetune", r.name))]
        written += [(p, behind) for p in write_finetune_figures(probe_rows, ft_rows, x, y, figures)]
    return written


def _read_runs(folders: dict[str, Path]) -> dict[str, Run]:
    """Each finished fine-tuning's metrics.json (coreecg.eval.runs); an unreadable one is logged
    and left out, so the other tables still come."""
    runs = {}
    for name, folder in folders.items():
        try:
            runs[name] = load_run(folder)
        except RunError as e:
            log.warning("%s", e)
    return runs


def _report_rows(study: Study) -> dict[str, list[str]]:
    """The variants file's row lists of the study's tables: the study's methods and its n/a rows;
    given encoders join a registered table's rows (not a variants file's ablation), last."""
    rows = {}
    for table in (t for t in study.tables if t in study.method_tables):
        rows[table] = [m for m in study.method_tables[table] if m in study.methods or m in study.unavailable]
        if table in known_tables():
            rows[table] += [m for m in study.encoders if m in study.methods and m not in rows[table]]
    return rows


def _differences_to(study: Study, reference: str) -> str:
    """Whom the tables' differences are to: report.reference, and/or, in a table whose rows each
    have their own (its registration's `differences`), those."""
    kinds = {t: table_for(t, list(study.method_tables)).differences for t in study.tables}
    to_reference = [t for t, to in kinds.items() if to == REFERENCE]
    own = [(t, to) for t, to in kinds.items() if to not in (None, REFERENCE)]
    if not own:
        return reference
    text = "; ".join(f"in {t}, {to}" for t, to in own)
    if to_reference:
        return f"{reference} ({', '.join(to_reference)}) and, {text}"
    return own[0][1] if len(own) == 1 else text


def _tables_section(study: Study, runs: dict[str, Run], cfg, report_dir: Path) -> list[str]:
    """report.tables built and written into report/tables/ (coreecg.eval.report.write_tables),
    and their lines of the index: each table's own (its registration's `index`)."""
    r = cfg.report
    inputs = TableInputs(list(runs.values()), r, _report_rows(study), dict(study.unavailable), tuple(study.allow),
                         tuple(study.published))
    written = write_tables(study.tables, inputs, report_dir / "tables")
    name_of = {run.path: name for name, run in runs.items()}
    lines = ["## Tables", "",
             f"Markdown, CSV and LaTeX (booktabs) in `tables/`; differences to {_differences_to(study, r.reference)} "
             f"with {r.level:.0%} intervals over training runs ({r.bootstrap_resamples} resamples of the test "
             f"patients within), marked with >= {r.min_runs} runs per method after {r.adjust} over each table; "
             f"F1: {r.f1} (docs/evaluation.md).", ""]
    for w in written:
        files = [str(p.relative_to(report_dir)) for p in w.files]
        lines.append(w.table.index(w.name, files, sorted(name_of[p] for p in w.runs if p in name_of)))
    return lines + [""]


def _figures_section(study: Study, output: Path, cfg, report_dir: Path) -> list[str]:
    """report.figures drawn into report/figures/, and their lines of the index."""
    lines, figures = [], []
    if "reconstruction" in study.figures:
        made = reconstruction_figure(study, output, cfg.report.reference, cfg.train.seed)
        figures += [made] if made else []
        if not made:
            lines.append("reconstruction: no finished pretraining of a method that reconstructs.")
    if "tsne" in study.figures:
        figures += tsne_figures(study, output, cfg.report.reference, cfg.train.seed)
    if "mask_rates" in study.figures:
        figures += mask_rate_figures(study, output)
    if figures:
        lines += ["## Figures", ""]
        for path, runs_behind in figures:
            rel = path.relative_to(report_dir)
            lines.append(f"- [`{rel}`]({rel}): " + ", ".join(f"`{r}`" for r in runs_behind))
        lines.append("")
    return lines


def write_study_report(study: Study, output: str | Path) -> Path:
    """Tables and figures of every finished run into output/report/; -> report/README.md."""
    output = Path(output).resolve()
    report_dir = output / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(study.config_file, study.report_overrides())
    runs = _read_runs(finished_runs(study, output, "finetune"))
    lines = [f"# Study {study.name}", "", f"Study file: `{study.path}`; runs: `{output / 'runs.csv'}`.", "",
             f"{len(finished_runs(study, output, 'pretrain'))} of {len(study.pretrain_runs())} pretraining and "
             f"{len(runs)} of {len(study.finetune_runs())} fine-tuning runs finished.", ""]
    lines += _tables_section(study, runs, cfg, report_dir) if runs else ["No fine-tuning run finished: no tables.", ""]
    lines += _figures_section(study, output, cfg, report_dir)
    index = report_dir / "README.md"
    index.write_text("\n".join(lines) + "\n")
    return index
