"""The table registry: a report table is one module that registers itself here, and no other code
names it. The report (coreecg.eval.report.write_tables) builds and writes the tables asked for, a
study (coreecg.study) checks its `report.tables` against the names registered, runs each table's
own checks before Ray starts and indexes what each table wrote in report/README.md.

    register_table("auroc_by_method", build=build, write=write, runs=lambda t: t.run_paths)

    build(name, inputs) -> the table (any object), or None: nothing to show
    write(table, folder) -> the files written (the first is linked from the study's index)
    runs(table) -> the run folders behind it (the index, all_runs.csv and the protocol check)

The built-ins (coreecg/eval/tables/: methods, label_efficiency, benchmark, encoder_objective) register themselves
when `coreecg.eval.tables` is imported; a plugin module does the same, imported through the
config's plugins (tests/plugin_table.py, docs/evaluation.md "Adding a table").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

if TYPE_CHECKING:
    from coreecg.config import ReportConfig
    from coreecg.eval.fairness import Allowance
    from coreecg.eval.runs import Run

T = TypeVar("T")
REFERENCE = "report.reference"      # a table whose differences are to the report's reference method


class TableError(ValueError):
    """An unknown table, or a table's own check of a study that failed: `key` is the entry of the
    study file it names (report.tables, report.published)."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key, self.reason = key, reason


@dataclass
class TableInputs:
    """What every table is built from: the report's readable runs and its settings. At a study's
    check (before any run) `runs` is empty and `report` None."""

    runs: Sequence[Run] = ()
    report: ReportConfig | None = None
    rows: Mapping[str, Sequence[str]] = field(default_factory=dict)   # a variants file's tables: name -> rows
    unavailable: Mapping[str, str] = field(default_factory=dict)      # row -> why it has no run (an n/a row)
    allow: Sequence[Allowance] = ()          # declared protocol differences (the variants file's allow:)
    published: Sequence[str] = ()            # published-numbers files (a study's report.published)
    _shared: dict = field(default_factory=dict, repr=False)

    def once(self, key: str, make: Callable[[], T]) -> T:
        """make(), computed once per report however many tables ask for `key` (e.g. the method
        tables' differences: each run's predictions are resampled once)."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


def index_line(name: str, files: Sequence[str], runs: Sequence[str]) -> str:
    """A table's line in a study's report/README.md: its files (the first linked), its runs."""
    if not files:
        return f"- **{name}**: no run of its rows finished: no table"
    links = [f"[`{files[0]}`]({files[0]})", *(f"`{f}`" for f in files[1:])]
    return f"- **{name}**: {', '.join(links)}; {len(runs)} run(s): " + ", ".join(f"`{r}`" for r in runs)


@dataclass(frozen=True)
class RegisteredTable:
    """A table as registered: the three hooks (the module docstring) and what a study needs.

    default: in a study's report.tables when it names none (and fine-tunes).
    variant_tables: builds a variants file's own tables (any name it lists that no table registers).
    differences: to whom its differences are (REFERENCE; a phrase for the study's index, e.g. each
        row's own baseline; None: it has none).
    study_keys: the study file's report keys it reads (report.published): given without it, an error.
    check(inputs): its own check of a study before Ray (TableError).
    compares_pretraining: whether its rows' pretraining protocols must agree (a study's check).
    allowances(rows): protocol differences its rows may have by design (coreecg.eval.fairness).
    index(name, files, runs): its line in the study's report/README.md.
    """

    name: str
    build: Callable[[str, TableInputs], Any]
    write: Callable[[Any, Path], list[Path]]
    runs: Callable[[Any], set[Path]]
    default: bool = False
    variant_tables: bool = False
    differences: str | None = REFERENCE
    study_keys: tuple[str, ...] = ()
    check: Callable[[TableInputs], None] | None = None
    compares_pretraining: bool = True
    allowances: Callable[[Sequence[str]], list[Allowance]] | None = None
    index: Callable[[str, Sequence[str], Sequence[str]], str] = index_line


TABLES: dict[str, RegisteredTable] = {}


def register_table(name: str, *, build: Callable[[str, TableInputs], Any], write: Callable[[Any, Path], list[Path]],
                   runs: Callable[[Any], set[Path]], **options: Any) -> RegisteredTable:
    """Register a table under `name` (what report.tables names); `options`: RegisteredTable's
    other fields. A name another module registered, or a second variant_tables, is a ValueError."""
    table = RegisteredTable(name, build, write, runs, **options)
    known = TABLES.get(name)
    if known is not None and known.build.__module__ != build.__module__:
        raise ValueError(f"table {name!r} is already registered by {known.build.__module__}")
    other = next((t.name for t in TABLES.values() if t.variant_tables and t.name != name), None)
    if table.variant_tables and other:
        raise ValueError(f"table {name!r}: {other!r} already builds the variants file's tables")
    TABLES[name] = table
    return table


def known_tables(variant_tables: Sequence[str] = ()) -> list[str]:
    """The names a report may ask for: the registered ones, then a variants file's own tables
    (the table that builds those is not asked for by its own name)."""
    own = [name for name, t in TABLES.items() if not t.variant_tables]
    return [*own, *(t for t in variant_tables if t not in own)]


def table_for(name: str, variant_tables: Sequence[str] = ()) -> RegisteredTable:
    """The registered table `name`, or the one that builds a variants file's tables for one of
    `variant_tables`; TableError("report.tables") otherwise."""
    known = TABLES.get(name)
    if known is not None and not known.variant_tables:
        return known
    builder = next((t for t in TABLES.values() if t.variant_tables), None)
    if name in variant_tables and builder is not None:
        return builder
    raise TableError("report.tables", f"unknown table {name!r}; known: {known_tables(variant_tables)}")


def default_tables() -> tuple[str, ...]:
    """A study's report.tables when it names none: the tables registered with default=True."""
    return tuple(name for name, t in TABLES.items() if t.default)
