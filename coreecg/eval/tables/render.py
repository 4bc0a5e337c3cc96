"""A results table (coreecg.eval.tables.table.Table) written out: Markdown as the paper prints it
(best per column bold, second underlined, a marked difference \\*), a CSV with every difference's
interval, p-values and run counts, and a booktabs LaTeX table in the paper's layout.

    write_table(table, folder)      # <name>.md, <name>.csv, <name>.tex
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

import numpy as np

from coreecg.data.declared import MARK as DECLARED
from coreecg.eval.runs import DATASETS, METRICS
from coreecg.eval.significance import NOT_TESTABLE, Difference
from coreecg.eval.tables.table import BELOW, LEAK, MISSING, UNAVAILABLE, Table, format_cell

ADJUST_NAMES = {"holm": "Holm's correction", "bh": "the Benjamini-Hochberg correction (false discovery rate)",
                "none": "no correction for multiple comparisons"}
SAMPLING_ONLY = "test-set sampling only, not a claim about the methods"
FEW_RUNS = "§"          # a difference from fewer than min_runs runs: its interval is test-set sampling only
UNTESTABLE = "∅"        # a difference with no variance to test it against (NOT_TESTABLE)


def _leak_notes(table: Table) -> list[str]:
    # a published family's declared overlap is its own declaration, not an overruled guard
    return [f"{LEAK} {m}: {n}" if DECLARED in n else f"{LEAK} {m}: trained with --allow-overlap; {n}"
            for m, notes in table.leaks.items() if m in table.cells for n in notes] + _below_notes(table)


def _rare_notes(table: Table) -> list[str]:
    """The legend of the rare classes each dataset's macro F1 and AUROC leave out."""
    out = []
    for dataset, classes in table.rare.items():
        names = ", ".join(f"{c} ({n} positive patient{'s' if n != 1 else ''})" for c, n in classes.items())
        out.append(f"Rare classes: {DATASETS.get(dataset, dataset)}: {len(classes)} class(es) with fewer positive test "
                   f"patients than report.min_positive_patients, left out of its macro F1 and AUROC: {names} "
                   "(docs/evaluation.md, \"Rare classes\").")
    for dataset in sorted(table.rare_unknown):
        out.append(f"Rare classes: {DATASETS.get(dataset, dataset)}: run(s) written before "
                   "report.min_positive_patients hold every class in their macro means; their differences, scored "
                   "from predictions.csv, leave out the classes under it, so a printed mean and its difference can "
                   "hold other classes.")
    for dataset in sorted(table.rare_argmax_stored):
        out.append(f"Rare classes: {DATASETS.get(dataset, dataset)}: the F1 column prints run(s)' stored argmax F1 "
                   "(metrics.json test.f1_argmax, written before per-class argmax F1), which holds the rare classes; "
                   "its differences leave them out, so the printed means and the difference hold other classes.")
    return out


def _below_notes(table: Table) -> list[str]:
    """The legend of BELOW: which cells, and what it means."""
    if not table.below_chance:
        return []
    cells = ", ".join(f"{m} {table.columns[j].label} (up to {100 * high:.1f})"
                      for (m, j), high in table.below_chance.items())
    return [f"{BELOW} below chance: the cell's 95 % AUROC interval lies under 50 (over its runs: mean ± t x SE; one "
            "run: its patient-bootstrap interval), so on this test set its scores rank the classes worse than "
            "constant outputs would. The interval over runs leaves out the sampling of the test set, which every "
            "run shares: runs that fail alike can sit under 50 on one test set and not on another "
            f"(docs/evaluation.md, \"Below chance\"): {cells}"]


def _lead(table: Table, row: str) -> list[str]:
    """The row's texts in the table's lead columns (Table.lead_columns), '' where it has none."""
    return [by_row.get(row, "") for by_row in table.lead_columns.values()]


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _f1_note(table: Table) -> str:
    """Which F1 the table prints (report.f1)."""
    if table.f1 == "threshold":
        return "F1: macro F1 at the paper's fixed 0.5 threshold (metrics.json test.f1)."
    text = ("F1: macro F1 of argmax decisions, as ST-MEM's code computes it (metrics.json test.f1_argmax), "
            "not the paper's 0.5 threshold")
    if table.f1_fallback:
        names = ", ".join(DATASETS.get(d, d) for d in table.f1_fallback)
        text += f"; {names}: multi-label, no argmax decision, so F1 at the 0.5 threshold (test.f1)"
    return text + "."


def _unmarkable_counts(table: Table) -> dict[str, int]:
    """How many of the table's cells have no mark for a reason other than their p-value, by kind."""
    sig, counts = table.significance, {}
    for method in table.cells:
        for j in range(len(table.columns)):
            d = table.difference(method, j)
            why = d if isinstance(d, str) else d.unmarkable if isinstance(d, Difference) else None
            for part in why.split("; ") if why else ():      # a cell may lack both runs and patients
                kind = ("runs" if part.startswith("fewer than") else "patients" if part.endswith(
                    f"fewer than {sig.min_test_patients}") else "untestable" if part == NOT_TESTABLE else part)
                counts[kind] = counts.get(kind, 0) + 1
    return counts


def _significance_note(table: Table, mark: str) -> str:
    """The legend of the significance mark: the rule, its correction and family, and the cells that
    cannot be marked and why (they are not in the family)."""
    sig = table.significance
    if sig is None:
        return ""
    if not sig.n_resamples:
        return "No differences between methods (report.bootstrap_resamples = 0)."
    if table.references is not None:
        if not any(ref in table.members for ref in table.references.values()):
            return "No runs of a baseline row in this table: no differences between methods."
        rows_of = {b: [m for m, r in table.references.items() if r == b] for b in table.references.values()}
        target, reference_row = "its row's baseline", (
            "; ".join(f"{', '.join(rows)} against {b}" for b, rows in rows_of.items())
            + "; a baseline's own row has no difference")
    elif sig.reference not in table.members:
        return f"No {sig.reference} runs in this table: no differences between methods."
    else:
        target, reference_row = sig.reference, f"{sig.reference}'s row is the reference"
    alpha = 1 - sig.level
    text = (f"{mark} the difference to {target} has a p-value below {alpha:g} after "
            f"{ADJUST_NAMES[sig.adjust]} within its metric's family: {_families_text(table)}. "
            f"Welch's t over training runs (each method >= {sig.min_runs} runs in the cell), test patients "
            f"resampled within ({sig.n_resamples:,} resamples; docs/evaluation.md, Differences between methods); "
            f"{reference_row}.{_verdicts_text(table)}")
    counts = _unmarkable_counts(table)
    excluded = " Cells that cannot be marked are not counted in the correction." if counts else ""
    if n := counts.pop("runs", 0):
        text += (f" {n} cell(s) have fewer than {sig.min_runs} runs of a method: their difference interval is "
                 f"{SAMPLING_ONLY}; never marked.")
    if n := counts.pop("patients", 0):
        text += f" {n} cell(s) have fewer than {sig.min_test_patients} test patients: not marked."
    if n := counts.pop("untestable", 0):
        text += (f" {n} cell(s) are not testable ({UNTESTABLE} under the differences): every run of both methods "
                 "gives the same value on every patient resample, to rounding, so there is no variance to test the "
                 "difference against; no p, never marked.")
    if counts:
        text += (f" {sum(counts.values())} cell(s) have no difference: "
                 + ", ".join(f"{n} with {why}" for why, n in counts.items()) + ".")
    return text + excluded


def _families_text(table: Table) -> str:
    """'AUROC (primary): 12 comparisons; ACC, F1 (secondary, each its own family): 12, 12'."""
    primary = table.significance.primary_metric
    name = {m: METRICS.get(m, m) for m in table.families}
    parts = [f"{name[primary]} (primary): {len(table.families[primary])} comparison(s)"] \
        if primary in table.families else [f"{METRICS.get(primary, primary)} (primary): no testable comparison"]
    secondary = [m for m in table.families if m != primary]
    if secondary:
        parts.append(f"{', '.join(name[m] for m in secondary)} (secondary, each corrected in its own family): "
                     + ", ".join(str(len(table.families[m])) for m in secondary))
    return "; ".join(parts)


def _verdicts_text(table: Table) -> str:
    """How many primary-metric differences are different, equivalent within the margin, or
    inconclusive, and the range of the smallest detectable differences."""
    sig = table.significance
    family = table.families.get(sig.primary_metric, [])
    if not family:
        return ""
    kinds = [table.verdict(m, j).split(" ")[0].rstrip(":") for m, j in family]
    sizes = sorted(100 * table.detectable[k] for k in family)
    label = METRICS.get(sig.primary_metric, sig.primary_metric)
    return (f" {label}: {kinds.count('different')} different, {kinds.count('equivalent')} equivalent within "
            f"±{sig.equivalence_margin:g} points (two one-sided tests, report.equivalence_margin), "
            f"{kinds.count('inconclusive')} inconclusive. The smallest {label} difference each comparison could "
            f"detect with power {sig.power:g} (the noncentral t of its own standard error and degrees of freedom, at "
            f"its family's level; the CSV's 'detectable'): median {np.median(sizes):.1f} points, range "
            f"{sizes[0]:.1f}-{sizes[-1]:.1f}.")


def _pp(x: float | None) -> str:
    return MISSING if x is None else f"{100 * x:+.1f}"


def table_markdown(table: Table) -> str:
    """The table as the paper prints it (best per column in bold, second underlined, a difference to
    the reference marked \\* by `Table.marked`), then a runs-per-cell table (n per dataset block;
    shown as 'ACC/F1/AUROC' counts when a metric was undefined in some run) and the differences to
    the reference."""
    cols = table.columns
    lines = [f"# {table.spec.title}", "",
             "Test-set metrics in percent: mean ± sample standard deviation over seeds (the mean alone "
             f"for one run). Best per column in **bold**, second <u>underlined</u>; {MISSING}: no run. "
             f"{_f1_note(table)}", "",
             _markdown_row(["Method", *table.lead_columns] + [c.label for c in cols]),
             _markdown_row(["---"] * (len(cols) + 1 + len(table.lead_columns)))]
    for method, row in table.cells.items():
        lead = _lead(table, method)
        if method in table.unavailable:
            lines.append(_markdown_row([f"{method}†", *lead] + [UNAVAILABLE] * len(cols)))
            continue
        label = method + (LEAK if method in table.leaks else "")
        out = []
        for j, values in enumerate(row):
            text = format_cell(values) or MISSING
            mean = round(100 * np.mean(values), 1) if values else None
            if mean is not None and mean == table.best(j):
                text = f"**{text}**"
            elif mean is not None and mean == table.second(j):
                text = f"<u>{text}</u>"          # GitHub renders it, as the paper underlines
            out.append(text + ("\\*" if table.marked(method, j) else "") + (BELOW if (method, j) in table.below_chance
                                                                             else ""))
        lines.append(_markdown_row([label, *lead] + out))
    lines += [_markdown_row([label, *[""] * len(table.lead_columns)] + [texts.get(j, "") for j in range(len(cols))])
              for label, texts in table.context]
    notes = [f"† {UNAVAILABLE}: {m}: {why}" for m, why in table.unavailable.items()] + _leak_notes(table) \
        + _rare_notes(table)
    if note := _significance_note(table, "\\*"):
        notes.append(note)
    notes += [f"Protocol: {n}" for n in table.footnotes] + table.notes
    if notes:
        lines += [""] + notes
    groups = list(dict.fromkeys(c.group for c in cols))
    lines += ["", "Runs per cell:", "",
              _markdown_row(["Method"] + groups), _markdown_row(["---"] * (len(groups) + 1))]
    for method, row in table.cells.items():
        counts = []
        for g in groups:
            n = [len(row[j]) for j, c in enumerate(cols) if c.group == g]
            counts.append(MISSING if not any(n) else str(n[0]) if len(set(n)) == 1 else "/".join(map(str, n)))
        lines.append(_markdown_row([method] + counts))
    lines += _differences_markdown(table)
    return "\n".join(lines) + "\n"


def _untestable(d) -> bool:
    return isinstance(d, Difference) and NOT_TESTABLE in (d.unmarkable or "")


def _differences_markdown(table: Table) -> list[str]:
    """The differences to the reference in percentage points with their intervals; an interval from
    test-set sampling alone (fewer than min_runs runs) is flagged FEW_RUNS, a difference with no
    variance to test it against UNTESTABLE."""
    cols, sig = table.columns, table.significance
    diffs = {m: [table.difference(m, j) for j in range(len(cols))] for m in table.cells}
    diffs = {m: row for m, row in diffs.items() if any(isinstance(d, Difference) for d in row)}
    if not diffs:
        return []

    def text(d) -> str:
        if not isinstance(d, Difference) or d.diff is None:
            return MISSING
        mark = UNTESTABLE if _untestable(d) else FEW_RUNS if d.p_value is None else ""
        return f"{_pp(d.diff)} [{_pp(d.low)}, {_pp(d.high)}]{mark}"

    if table.references is not None:
        head = ("Differences to each row's baseline in percentage points (the row's mean over its runs minus the "
                "baseline's)")
        names = {m: f"{m} − {table.references[m]}" for m in diffs}
    else:
        head = (f"Differences to {sig.reference} in percentage points (the method's mean over its runs minus "
                f"{sig.reference}'s)")
        names = {m: m for m in diffs}
    untestable = (f"; {UNTESTABLE} not testable: every run of both methods gives the same value on every patient "
                  "resample (to rounding), no variance to test the difference against, no p"
                  if any(_untestable(d) for row in diffs.values() for d in row) else "")
    lines = ["", f"{head} [{100 * sig.level:g} % interval over training runs and test patients; {FEW_RUNS} "
                 f"fewer than {sig.min_runs} runs of a method: {SAMPLING_ONLY}{untestable}]; p-values, run counts "
                 "and why a cell is not marked in the CSV:", "",
             _markdown_row(["Method"] + [c.label for c in cols]), _markdown_row(["---"] * (len(cols) + 1))]
    return lines + [_markdown_row([names[method]] + [text(d) for d in row]) for method, row in diffs.items()]


DIFF_FIELDS = ("diff", "diff low", "diff high", "p", "p adjusted", "family", "detectable", "equivalence p adjusted",
               "verdict", "diff runs", "diff reference runs", "unmarked because")


def _diff_fields(table: Table, method: str, j: int) -> list:
    """The CSV's difference fields of one cell: percentage points, raw and adjusted p, the run
    counts of the method and the reference, why it has no mark ('' where none applies)."""
    d = table.difference(method, j)
    if not isinstance(d, Difference):
        return [""] * (len(DIFF_FIELDS) - 1) + [table.unmarked_because(method, j)]
    pp = ["" if x is None else f"{100 * x:.2f}" for x in (d.diff, d.low, d.high)]
    adjusted, key = table.adjusted.get((method, j)), (method, j)
    family = table.family_of(method, j)
    detectable, tost = table.detectable.get(key), table.equivalence.get(key)
    return pp + ["" if d.p_value is None else f"{d.p_value:.3g}", "" if adjusted is None else f"{adjusted:.3g}",
                 "" if family is None else f"{family} ({len(table.families[family])})",
                 "" if detectable is None else f"{100 * detectable:.2f}", "" if tost is None else f"{tost:.3g}",
                 table.verdict(method, j), len(d.seeds), len(d.reference_seeds), table.unmarked_because(method, j)]


def write_table_csv(table: Table, path: Path) -> None:
    """One row per method; per column the printed cell ('' when missing) and its run count, then a
    note; after it, per column the difference to the reference in percentage points (diff, diff
    low, diff high), its raw and adjusted p-values, the run counts of the method and of the
    reference, and why the cell is not marked ('' where none applies: `_diff_fields`)."""
    diff_header = [f"{c.label} {name}" for c in table.columns for name in DIFF_FIELDS]
    per_row = table.references is not None      # a reference per row: its own column after the method
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method"] + (["baseline"] if per_row else []) + list(table.lead_columns)
                   + [h for c in table.columns for h in (c.label, f"{c.label} n")] + ["note"] + diff_header)
        for method, row in table.cells.items():
            first = [method] + ([table.references.get(method, "")] if per_row else []) + _lead(table, method)
            if method in table.unavailable:
                w.writerow(first + [UNAVAILABLE, 0] * len(table.columns) + [table.unavailable[method]]
                           + [""] * len(diff_header))
                continue
            w.writerow(first + [x for values in row for x in (format_cell(values), len(values))]
                       + ["; ".join(table.leaks.get(method, []))]
                       + [x for j in range(len(table.columns)) for x in _diff_fields(table, method, j)])
        for label, texts in table.context:      # placed for context: no run count, no difference
            w.writerow([label] + ([""] if per_row else []) + [""] * len(table.lead_columns)
                       + [x for j in range(len(table.columns)) for x in (texts.get(j, ""), "")]
                       + ["context, not run here"] + [""] * len(diff_header))


MARK = "\x00"      # stands for the significance mark until the caption is escaped
_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                  "–": "--", "±": r"$\pm$", BELOW: r"$\downarrow$", UNTESTABLE: r"$\emptyset$",
                  "†": r"\textsuperscript{\dag}", LEAK: r"\textsuperscript{\ddag}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def _latex_cell(table: Table, method: str, j: int) -> str:
    values = table.cells[method][j]
    if method in table.unavailable:
        return UNAVAILABLE
    if not values:
        return "--"
    text = format_cell(values).replace(" ± ", r" $\pm$ ")
    mean = round(100 * np.mean(values), 1)
    if mean == table.best(j):
        text = rf"\textbf{{{text}}}"
    elif mean == table.second(j):
        text = rf"\underline{{{text}}}"
    return (text + (r"\textsuperscript{*}" if table.marked(method, j) else "")
            + (r"$\downarrow$" if (method, j) in table.below_chance else ""))


def _latex_block(table: Table, js: list[int], label: str | None) -> list[str]:
    """One variant's row block over the columns `js`: a row per method, then the published numbers
    placed for context. label: the variant's, in a first multirow column (None: one variant, no
    such column)."""
    extra = len(table.lead_columns)
    methods = [m for m, row in table.cells.items()
               if label is None or m in table.unavailable or any(row[j] for j in js)]
    rows = []
    for i, method in enumerate(methods):
        name = latex_escape(method + (LEAK if method in table.leaks else "")) + \
            (r"\textsuperscript{\dag}" if method in table.unavailable else "")
        first = ([rf"\multirow{{{len(methods)}}}{{*}}{{{latex_escape(label.replace('-lead', ''))}}}" if i == 0
                  else ""] if label is not None else [])
        rows.append(" & ".join(first + [name] + [latex_escape(t) for t in _lead(table, method)]
                               + [_latex_cell(table, method, j) for j in js]) + r" \\")
    # published numbers placed for context, under the block of the columns they fill
    rows += [" & ".join(([""] if label is not None else []) + [latex_escape(context)] + [""] * extra
                        + [latex_escape(texts.get(j, "")) for j in js]) + r" \\"
             for context, texts in table.context if set(texts) & set(js)]
    return rows


def table_latex(table: Table) -> str:
    """The table as a booktabs `table` in the paper's layout: methods x datasets x (ACC, F1, AUROC),
    best per column bold, second underlined, a marked difference to the reference (`Table.marked`)
    \\textsuperscript{*}; a table of several variants (leads, fractions) gets one row block per
    variant, as the paper's Tables 2 and 3. Needs \\usepackage{booktabs, multirow}."""
    cols, variants = table.columns, table.spec.variants
    datasets = list(dict.fromkeys(c.dataset for c in cols))
    index = {(c.dataset, c.leads, c.fraction, c.metric): j for j, c in enumerate(cols)}
    lead = 2 if len(variants) > 1 else 1
    extra = len(table.lead_columns)
    k = len(METRICS)
    caption = [f"{table.spec.title}. Test-set metrics in percent, mean ± standard deviation over seeds; best per "
               "column in bold, second underlined.", _f1_note(table)]
    caption += [f"† {UNAVAILABLE}: {m}: {why}." for m, why in table.unavailable.items()]
    caption += [f"{note}." for note in _leak_notes(table)]
    caption += [note] if (note := _significance_note(table, MARK)) else []
    caption += [f"Protocol: {n}." for n in table.footnotes] + table.notes
    lines = [f"% {table.spec.name}: written by coreecg/eval/tables/render.py; needs \\usepackage{{booktabs,multirow}}",
             r"\begin{table}[t]", r"\centering",
             r"\caption{" + latex_escape(" ".join(caption)).replace(MARK, r"\textsuperscript{*}") + "}",
             rf"\label{{tab:{table.spec.name}}}",
             r"\begin{tabular}{" + "l" * lead + "r" * extra + " " + " ".join("c" * k for _ in datasets) + "}",
             r"\toprule"]
    head = ([rf"\multirow{{2}}{{*}}{{\textbf{{{latex_escape(table.spec.block)}}}}}"] if lead == 2 else [])
    head += [r"\multirow{2}{*}{\textbf{Method}}"]
    head += [rf"\multirow{{2}}{{*}}{{\textbf{{{latex_escape(h)}}}}}" for h in table.lead_columns]
    head += [rf"\multicolumn{{{k}}}{{c}}{{\textbf{{{latex_escape(DATASETS.get(d, d))}}}}}" for d in datasets]
    before = lead + extra      # the columns before the metrics
    lines += [" & ".join(head) + r" \\",
              " ".join(rf"\cmidrule(lr){{{before + 1 + i * k}-{before + (i + 1) * k}}}" for i in range(len(datasets))),
              " & ".join([""] * before + [label for _ in datasets for label in METRICS.values()]) + r" \\", r"\midrule"]
    blocks = []
    for leads, fraction, label in variants:
        js = [index[(d, leads, fraction, m)] for d in datasets for m in METRICS]
        if rows := _latex_block(table, js, label if lead == 2 else None):
            blocks.append(rows)
    for i, rows in enumerate(blocks):
        lines += ([r"\midrule"] if i else []) + rows
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_table(table: Table, folder: Path) -> list[Path]:
    """<name>.md, .csv and .tex of the table (its spec's name) in `folder` -> the three files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    md, csv_path, tex = (folder / f"{table.spec.name}.{ext}" for ext in ("md", "csv", "tex"))
    md.write_text(table_markdown(table))
    write_table_csv(table, csv_path)
    tex.write_text(table_latex(table))
    return [md, csv_path, tex]
