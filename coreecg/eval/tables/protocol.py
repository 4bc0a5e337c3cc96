"""One protocol per table: the runs behind a table's cells checked by coreecg/eval/fairness.py (only
what defines a method may differ between its rows) before the table is written."""
from __future__ import annotations

from pathlib import Path

from coreecg.eval.fairness import check_table, run_entries
from coreecg.eval.tables.registry import TableInputs


def protocol_footnotes(name: str, paths: set[Path], inputs: TableInputs) -> list[str]:
    """The check of table `name`'s runs (`paths`, among inputs.runs) against inputs.allow:
    UnfairTableError naming an undeclared difference; -> its footnotes (the declared differences,
    and what could not be checked, e.g. an encoder that cannot be opened). Each run's config and
    encoder are read once per report, however many tables hold it."""
    protocols = inputs.once("protocols", lambda: run_entries(inputs.runs))
    behind = [protocols[Path(r.path)] for r in inputs.runs if r.path in paths]
    notes = check_table(name, [e for entries, _ in behind for e in entries], inputs.allow, seeds="note")
    return list(dict.fromkeys([*notes, *(n for _, ns in behind for n in ns)]))
