"""The encoder x objective table: which encoder, under which objective? The label-efficiency
table's rows and rule (one row per variant and mode; a linear row against Random init under the
same probe, a fine-tune row against Supervised), found within each encoder: every encoder's
objectives are compared with its own baselines. Beside each row: its encoder's parameters and
train GFLOP per sample; under the measured rows, published numbers placed for context
(studies/encoders.yaml, docs/evaluation.md "Encoder x objective table").

    table = encoder_objective_table(runs, report, published=[load_published("studies/published/encoders.yaml")])
    write_encoder_objective(table, out_dir)   # encoder_objective.md, .csv, .tex, encoder_objective_verdicts.md

A row's encoder is what its runs' config.yaml builds (model.arch and input, model.*; its sizes, encoders.<arch>;
plugins: `encoder_key`), never its name: a "Supervised" run trained as another architecture than
its name says sits with that architecture, and its Encoder column says which. Parameters and
FLOPs: `coreecg.encoders.cost.encoder_cost`, once per encoder; the differences, intervals, marks
and verdicts are the label-efficiency table's (`label_efficiency_table` with a group per encoder),
written by its writer; published numbers are read as the benchmark table reads them
(`load_published`, `shares_text`) and never compared.

Registered as `encoder_objective`: a study asks for it in report.tables and gives its published
files as report.published.
"""
from __future__ import annotations

import re
from math import isclose
from pathlib import Path
from typing import Sequence

from coreecg.config import ConfigError, ReportConfig, load_config
from coreecg.eval.runs import DATASETS, Run, RunError
from coreecg.eval.tables.benchmark import MODE_NAMES, Published, check_published, load_published, shares_text
from coreecg.eval.tables.label_efficiency import (LabelEfficiencyTable, index, label_efficiency_runs,
                                                  label_efficiency_table, row_name, write_label_efficiency)
from coreecg.eval.tables.protocol import protocol_footnotes
from coreecg.eval.tables.registry import TableInputs, register_table

# Lazy imports: the encoder's cost (torch), where the table is drawn: a study's checks
# import coreecg.eval.tables before Ray and stay torch-free.

ENCODER_OBJECTIVE_TABLE = "encoder_objective"
TITLE = "Encoders x objectives (12 leads)"
ENCODER, PARAMS, GFLOP = "Encoder", "Params", "Train GFLOP/sample"
PUBLISHED = "°"         # a published file's mark (one per file: °, °°, ...); * is the significance mark
COST_NOTE = (f"{PARAMS}: the encoder's parameters; {GFLOP}: one training step of the encoder alone, forward and "
             "backward, per sample of 12 leads x model.input_samples (torch's FlopCounterMode: matrix products, "
             "convolutions and attention; not FFTs, which S4's long convolutions are, nor pointwise operations; "
             "not the objective's heads, decoders or extra views: coreecg/encoders/cost.py), both of the encoder its "
             "runs' config.yaml builds. Each encoder's pretrained rows are compared with its own Random init "
             "(linear) and Supervised (fine-tune) rows; between encoders the table places the numbers side by side.")


def run_config(run: Run):
    """The Config of a run folder's config.yaml (RunError naming the folder otherwise)."""
    try:
        return load_config(Path(run.path) / "config.yaml")
    except (OSError, ConfigError) as e:
        raise RunError(f"{run.path}: its config.yaml cannot be read ({e}); the encoder x objective table builds "
                       "its encoder from it") from None


def encoder_key(config) -> str:
    """What names an encoder as built: model.arch and its input (model.*), its sizes (its own
    encoders.<arch> section), the plugins that register it."""
    own = getattr(config.encoders, config.model.arch, None)
    return repr((config.model, own, tuple(config.plugins)))


def format_params(n: int) -> str:
    """'3.45M', '12.5k', '950'."""
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k" if n >= 1e3 else str(n)


def encoder_objective_table(runs: Sequence[Run], report: ReportConfig | None = None,
                   published: Sequence[Published] = ()) -> LabelEfficiencyTable:
    """The table of `runs` (12-lead runs of modes linear, frozen, finetune and scratch; the others
    are left out): the label-efficiency table grouped by encoder, its lead columns (Encoder,
    Params, Train GFLOP/sample) and `published` numbers as context rows. RunError for a run whose
    config.yaml cannot be read, or a row whose runs were trained as two encoders."""
    # torch is imported here, not with coreecg.eval.tables: a study's checks before Ray stay torch-free
    from coreecg.encoders.cost import encoder_cost

    kept = label_efficiency_runs(runs)
    configs = {r.path: run_config(r) for r in kept}
    keys = {path: encoder_key(c) for path, c in configs.items()}
    table = label_efficiency_table(kept, report, group=lambda r: keys[r.path], name=ENCODER_OBJECTIVE_TABLE,
                                   title=TITLE)
    table.heading = "Encoders x objectives"
    first = {}
    for r in kept:
        first.setdefault(keys[r.path], configs[r.path])
    costs = {key: (config.model.arch, encoder_cost(config)) for key, config in first.items()}
    by_row: dict[str, list[str]] = {}          # row -> the encoders of its runs (one, unless they differ)
    for r in kept:
        if keys[r.path] not in (found := by_row.setdefault(row_name(r), [])):
            found.append(keys[r.path])
    text = {ENCODER: lambda c: c[0], PARAMS: lambda c: format_params(int(c[1]["parameters"])),
            GFLOP: lambda c: f"{c[1]['train_gflop_per_sample']:.3g}"}
    table.lead_columns = {header: {row: " / ".join(show(costs[k]) for k in ks) for row, ks in by_row.items()}
                          for header, show in text.items()}
    table.notes = [COST_NOTE]
    _add_published(table, kept, published)
    return table


def _add_published(table: LabelEfficiencyTable, runs: Sequence[Run], published: Sequence[Published]) -> None:
    """Each published file's numbers as context rows in its mode's column of each dataset, 100 % of
    the training data (its AUROC column; the label-efficiency rows' fine-tune and linear runs share
    the columns, the note says which mode the numbers are), under a line saying what they share
    with the measured runs (`shares_text`); numbers that share neither go to a note apart."""
    columns = {c.dataset: j for j, c in enumerate(table.columns) if c.metric == "auroc" and isclose(c.fraction, 1.0)}
    for k, pub in enumerate(published, 1):
        mark = PUBLISHED * k
        shares = {d: shares_text(pub, d, {r.record.get("split_rule", "patients") for r in runs if r.dataset == d})
                  for d in columns}
        shown = {d: j for d, j in columns.items() if not shares[d][1] and any(d in v for v in pub.rows.values())}
        if shown:
            table.context.append((f"*published{mark}: shares with the measured rows*",
                                  {j: shares[d][0] for d, j in shown.items()}))
            table.context += [(f"{method}{mark}",
                               {j: f"{100 * values[d]:.1f}" for d, j in shown.items() if d in values})
                              for method, values in pub.rows.items() if set(values) & set(shown)]
        table.notes.append(f"{mark} Published, not run here ({MODE_NAMES[pub.mode]}), placed for context: never "
                           f"compared, bold or marked. {pub.source}. Protocol: {pub.protocol} ({pub.path.name}).")
        apart = [f"{DATASETS.get(d, d)} ({shares[d][0]}): "
                 + ", ".join(f"{m} {100 * v[d]:.1f}" for m, v in pub.rows.items() if d in v)
                 for d in columns if shares[d][1] and any(d in v for v in pub.rows.values())]
        if apart:
            table.notes.append(f"{mark} Not in a column (sharing neither the test records nor the classes with the "
                               "measured rows, or not declared in its file): " + "; ".join(apart) + ".")


DECLARED = re.compile(r"^.+? differs? in (\S+) \((.*)\): (.+)$")


def one_line_per_key(notes: Sequence[str], methods: Sequence[str]) -> list[str]:
    """The protocol check's footnotes with each declared difference once: the check writes one per
    comparison (pretraining, each fine-tuning cell), each listing every row's value as
    "<method>: <value>, ..."; here one line per (key, reason) with the distinct values in first-seen
    order (`methods`: the runs' method names, which delimit the values)."""
    names = "|".join(re.escape(m) for m in sorted(methods, key=len, reverse=True))
    value = re.compile(rf"(?:^|, )(?:{names}): (.*?)(?=, (?:{names}): |$)") if names else None
    found: dict[tuple[str, str], list[str]] = {}
    kept = []
    for note in notes:
        m = DECLARED.match(note)
        if m is None or value is None:
            kept.append(note)
            continue
        values = found.setdefault((m.group(1), m.group(3)), [])
        values += [v for v in dict.fromkeys(value.findall(m.group(2))) if v not in values]
    return [f"the rows differ in {key} ({', '.join(values)}): {reason}" for (key, reason), values in found.items()] \
        + kept


def build_for_report(name: str, inputs: TableInputs) -> LabelEfficiencyTable:
    """The table of the report's runs beside inputs.published, its rows' protocols checked
    (coreecg/eval/fairness.py against the variants file's allow:)."""
    table = encoder_objective_table(inputs.runs, inputs.report, [load_published(p) for p in inputs.published])
    notes = protocol_footnotes(table.spec.name, table.run_paths, inputs)
    table.footnotes = one_line_per_key(notes, list(dict.fromkeys(r.method for r in inputs.runs)))
    return table


def write_encoder_objective(table: LabelEfficiencyTable, out_dir: str | Path) -> list[Path]:
    """encoder_objective.md (the table, the differences to each row's baseline, every difference with
    its p, the verdicts and what it can detect), .csv, .tex and encoder_objective_verdicts.md in out_dir."""
    return write_label_efficiency(table, out_dir)


register_table(ENCODER_OBJECTIVE_TABLE, build=build_for_report, write=write_encoder_objective,
               runs=lambda table: table.run_paths,
               differences="each encoder's own baselines (its Random init under the same probe, its Supervised for "
                           "fine-tuning)",
               study_keys=("published",), check=check_published, index=index)
