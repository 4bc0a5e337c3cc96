"""A study's report: its tables (coreecg.eval.report: Markdown, CSV, booktabs LaTeX, differences
to the reference method over training runs) and figures, and `report/README.md`, an index naming
each table and figure with the runs behind it."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from coreecg.config import load_config
from coreecg.data.corpus import load_manifest
from coreecg.eval.label_efficiency import extra_tables
from coreecg.eval.report import RunError, load_run, table_runs, table_specs, variant_of, write_report
from coreecg.study.runner import run_dir
from coreecg.tune.trials import is_done
from coreecg.study.spec import BENCHMARK_TABLE, LABEL_EFFICIENCY_TABLE, Study

log = logging.getLogger(__name__)


def finished_runs(study: Study, output: Path, phase: str) -> dict[str, Path]:
    runs = study.pretrain_runs() if phase == "pretrain" else study.finetune_runs()
    return {r.name: run_dir(output, phase, r.name) for r in runs if is_done(run_dir(output, phase, r.name))}


def _members(table: str, methods: list[str] | None, runs: dict[str, object]) -> list[str]:
    """The run folders (names) a table's cells are computed from (as coreecg.eval.report picks them)."""
    specs = table_specs(list(runs.values()))
    spec = next((t for t in specs if t.name == table), specs[0])
    shown = {id(r) for r in table_runs(spec, list(runs.values()))}
    return [name for name, run in runs.items()
            if id(run) in shown and (methods is None or run.method in methods) and variant_of(spec, run)]


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
    from coreecg.methods import build_method
    from coreecg.checkpoints import CHECKPOINT_FILE, checkpoint_dirs, load_checkpoint
    from coreecg.train.pretraining import figure_windows

    finished = finished_runs(study, output, "pretrain")
    models, runs, windows = {}, [], None
    by_method: dict[str, str] = {}
    for r in study.pretrain_runs():          # each method's first finished seed; never a mask-rate cell
        if r.name in finished and not r.params:
            by_method.setdefault(r.variant, r.name)
    loaded = {}
    for method, name in by_method.items():
        dirs = checkpoint_dirs(finished[name])
        if not dirs:
            continue
        payload, config = load_checkpoint(dirs[-1] / CHECKPOINT_FILE)
        model = build_method(config)
        if model.can_reconstruct:
            model.load_state_dict(payload["model"])
            loaded[method] = (model, config, name)
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
    from coreecg.model.classifier import Classifier
    from coreecg.model.published import build_encoder
    from coreecg.checkpoints import load_checkpoint

    metrics = json.loads((run / "metrics.json").read_text())
    payload, config = load_checkpoint(run / "best.pt")
    f = config.finetune
    model = Classifier.for_mode(build_encoder(config.model), len(metrics["class_names"]), f.leads,
                                bool(metrics["multilabel"]), f.mode, f.head)
    model.load_state_dict(payload["model"])
    split = load_split(config.data.corpus, "test")
    stored = list(load_manifest(config.data.corpus)["signal"]["leads"])
    probs, feats = predict(model, split.signal, [stored.index(x) for x in f.leads], config.data.crop_samples,
                           f.eval_crops, torch.device("cpu"), f.eval_batch_size)
    records = to_records(split, probs, feats)
    return records.features, records.y, list(metrics["class_names"]), bool(metrics["multilabel"])


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
    from coreecg.study.mask_rates import cell_result, probe_row, write_finetune_figures, write_probe_results

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


def _reference_text(study: Study, cfg) -> str:
    """Whom the tables' differences are to: report.reference, and/or each label-efficiency row's baseline."""
    own = "each row's baseline (Random init under the same probe, Supervised for fine-tuning)"
    others = [t for t in study.tables if t not in (LABEL_EFFICIENCY_TABLE, BENCHMARK_TABLE)]
    if LABEL_EFFICIENCY_TABLE not in study.tables:
        return cfg.report.reference
    return f"{cfg.report.reference} ({', '.join(others)}) and, in {LABEL_EFFICIENCY_TABLE}, {own}" if others else own


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
        for t in set(method_tables) & {"comparison"}:     # given encoders join the built-in table, last
            method_tables[t] += [m for m in study.encoders if m in rows and m not in method_tables[t]]
        method_tables = {t: m for t, m in method_tables.items() if m}
        if [t for t in study.tables if t != BENCHMARK_TABLE]:
            write_report([r.path for r in runs.values()], report_dir / "tables",
                         method_tables, study.unavailable, report=cfg.report, allow=study.allow,
                         extra=extra_tables(LABEL_EFFICIENCY_TABLE in study.tables))
        lines += ["## Tables", "",
                  f"Markdown, CSV and LaTeX (booktabs) in `tables/`; differences to {_reference_text(study, cfg)} with "
                  f"{cfg.report.level:.0%} intervals over training runs ({cfg.report.bootstrap_resamples} resamples "
                  f"of the test patients within), marked with >= {cfg.report.min_runs} runs per method after "
                  f"{cfg.report.adjust} over each table; F1: {cfg.report.f1} (docs/evaluation.md).", ""]
        if BENCHMARK_TABLE in study.tables:
            from coreecg.eval.benchmark import benchmark_table, check_benchmark, load_published, write_benchmark

            bench = benchmark_table(list(runs.values()), [load_published(p) for p in study.published])
            bench.footnotes = check_benchmark(bench, study.allow)
            write_benchmark(bench, report_dir / "tables")
            behind = sorted(name for name, run in runs.items() if any(r is run for row in bench.cells.values()
                                                                      for col in row.values() for r in col))
            lines.append(f"- **{BENCHMARK_TABLE}**: [`tables/benchmark.md`](tables/benchmark.md), "
                         f"`tables/benchmark.csv`; {len(behind)} run(s): " + ", ".join(f"`{m}`" for m in behind))
        for table in (t for t in study.tables if t != BENCHMARK_TABLE):
            if table == LABEL_EFFICIENCY_TABLE:
                from coreecg.eval.label_efficiency import VERDICTS_FILE, label_efficiency_runs

                kept = {id(r) for r in label_efficiency_runs(list(runs.values()))}
                behind = sorted(name for name, run in runs.items() if id(run) in kept)
                lines.append(f"- **{LABEL_EFFICIENCY_TABLE}**: [`tables/{LABEL_EFFICIENCY_TABLE}.md`]"
                             f"(tables/{LABEL_EFFICIENCY_TABLE}.md), `tables/{LABEL_EFFICIENCY_TABLE}.csv`, "
                             f"`tables/{LABEL_EFFICIENCY_TABLE}.tex`"
                             + (f", verdicts in [`tables/{VERDICTS_FILE}`](tables/{VERDICTS_FILE})"
                                if (report_dir / "tables" / VERDICTS_FILE).is_file() else "")
                             + f"; {len(behind)} run(s): " + ", ".join(f"`{m}`" for m in behind))
                continue
            file = table if table in ("comparison", "lead_reduction", "train_fraction") else f"ablation_{table}"
            members = _members(table if file == table else "comparison",
                               method_tables.get(table) if table in method_tables else None, runs)
            lines.append(f"- **{table}**: [`tables/{file}.md`](tables/{file}.md), `tables/{file}.csv`, "
                         f"`tables/{file}.tex`; {len(members)} run(s): "
                         + ", ".join(f"`{m}`" for m in sorted(members)))
        lines.append("")
    else:
        lines += ["No fine-tuning run finished: no tables.", ""]
    figures: list[tuple[Path, list[str]]] = []
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
    index = report_dir / "README.md"
    index.write_text("\n".join(lines) + "\n")
    return index
