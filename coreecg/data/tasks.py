"""Downstream tasks: what a corpus's targets are, where they come from, and of which kind.

A task is one registered module (like a source, a method, an encoder or a table):

    from coreecg.data.tasks import register_task

    register_task("lvef", kind="regression", column="lvef", unit="%", plausible=(5.0, 90.0),
                  description="left-ventricular ejection fraction, from the labels CSV")

Kinds and what each implies downstream (docs/tasks.md):

- "labels": the source's own diagnostic statements, multi- or single-label (the corpus's class
  names); the built-in task "labels" is every corpus built before tasks existed, and every corpus
  built without `task=<a registered task>`. Head: Linear(D, K); loss: BCE (multi-label) or softmax
  cross-entropy; metrics: ACC, F1, macro AUROC (coreecg.eval.metrics).
- "binary": two classes (`classes`: negative, positive) from a record's metadata (sex); stored and
  trained as a single-label task of those two classes, so every label metric and statistic applies.
- "regression": one number per record (age, height, weight, a numeric labels-CSV column). Stored in
  the corpus's `target` column; standardised on the train split (the scaler travels in the model's
  state); head: Linear(D, 1); loss: MSE on the standardised target; metrics: MAE (in the target's
  unit and in SD units), RMSE, R², Pearson r, each with a patient-bootstrap interval
  (coreecg.eval.regression). Lower MAE is better.

Where targets come from: `meta_keys` (the first of these keys a reader put in `Record.meta` that
holds a value: PTB-XL's, CinC 2021's, CODE-15%'s age and sex), or `column` (a numeric column of a
hospital export's labels CSV, `data.sources.<export>.labels`), or `target` (any function of the
Record: a plugin's own rule). A record whose target is missing is left out and counted (quarantine
reason "missing target: ..."); one outside `plausible` is quarantined with the value and the range
(an age of 300, a negative weight): never imputed, never clipped.

A corpus of a task is built as a label task is: `--set data.sources.ptbxl.task=age`. The reader is
then built in its label-free view (records need no diagnostic statement) and its records carry the
task's target (`TaskSource`). The corpus manifest records the task (`manifest["task"]`).

This module sits in the data layer: no torch (tests/test_data_layering.py).
"""
from __future__ import annotations

import csv
import inspect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from coreecg.data.record import Record, RecordError

Kind = Literal["labels", "binary", "regression"]
KINDS = ("labels", "binary", "regression")
LABELS = "labels"                 # the source's own statements: the task of every corpus without one
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class TaskSpec:
    """One registered task (see the module docstring for the fields' meaning).

    name: registry name (a config value: `data.sources.<source>.task=<name>`).
    kind: "labels" | "binary" | "regression".
    meta_keys: Record.meta keys tried in order for the raw value; column: a labels-CSV column;
    target: a function Record -> raw value or None (overrides both).
    classes: a binary task's (negative, positive) class names; to_class: raw value -> one of them
        or None (unknown).
    unit: the target's unit ("years", "cm", "kg"); plausible: (low, high) inclusive bounds of a
        regression target; description: one line for docs and tables.
    """

    name: str
    kind: Kind
    meta_keys: tuple[str, ...] = ()
    column: str = ""
    target: Callable[[Record], Any] | None = field(default=None, compare=False)
    classes: tuple[str, ...] = ()
    to_class: Callable[[Any], str | None] | None = field(default=None, compare=False)
    unit: str = ""
    plausible: tuple[float, float] | None = None
    description: str = ""

    @property
    def regression(self) -> bool:
        return self.kind == "regression"

    @property
    def output(self) -> str:
        """The target's name in messages and outputs: the task's, a column task's column."""
        return self.name[len(COLUMN_PREFIX):] if self.name.startswith(COLUMN_PREFIX) else self.name

    @property
    def class_names(self) -> tuple[str, ...]:
        """What the corpus stores as its class names: a binary task's two classes, a regression
        task's one output (`output`); a label task's come from its source."""
        return self.classes if self.kind == "binary" else (self.output,) if self.regression else ()

    def describe(self) -> dict[str, Any]:
        """The JSON form a corpus manifest, metrics.json and an export record."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.unit:
            out["unit"] = self.unit
        if self.plausible is not None:
            out["plausible"] = [float(v) for v in self.plausible]
        if self.classes:
            out["classes"] = list(self.classes)
        if self.description:
            out["description"] = self.description
        return out

    # -- targets

    def raw(self, record: Record, column_values: dict[str, str] | None = None) -> Any:
        """The record's raw target value, or None where it is not stated."""
        if self.target is not None:
            return self.target(record)
        if self.column:
            return None if column_values is None else column_values.get(record.record_id)
        for key in self.meta_keys:
            value = record.meta.get(key)
            if not _missing(value):
                return value
        return None

    def apply(self, record: Record, column_values: dict[str, str] | None = None) -> Record:
        """`record` with this task's target: a binary task's class as its labels, a regression
        task's value in meta["target"] (float). RecordError "missing target" / "implausible"."""
        value = self.raw(record, column_values)
        where = f"column {self.column!r}" if self.column else "/".join(self.meta_keys) or "the task's rule"
        if _missing(value):
            raise RecordError(record.path, f"missing target: no {self.output} ({where} not stated)")
        if self.kind == "binary":
            name = (self.to_class or _as_class(self.classes))(value)
            if name is None:
                raise RecordError(record.path, f"missing target: {self.output} {value!r} is none of "
                                               f"{', '.join(self.classes)}")
            record.labels = (name,)
            return record
        try:
            number = float(str(value).strip())
        except ValueError:
            raise RecordError(record.path, f"missing target: {self.output} {value!r} is not a number") from None
        if not math.isfinite(number):
            raise RecordError(record.path, f"missing target: {self.output} is {number}")
        if self.plausible is not None and not self.plausible[0] <= number <= self.plausible[1]:
            raise RecordError(record.path, f"implausible {self.output}: {number:g} {self.unit} outside "
                                           f"[{self.plausible[0]:g}, {self.plausible[1]:g}]".replace("  ", " "))
        record.labels = (self.output,)
        record.meta = {**record.meta, "target": number}
        return record


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and value.strip().lower() in ("", "nan", "na", "unknown", "none", "null")


def _as_class(classes: tuple[str, ...]) -> Callable[[Any], str | None]:
    def to_class(value: Any) -> str | None:
        text = str(value).strip()
        return text if text in classes else None
    return to_class


# ---------------------------------------------------------------------------- registry

TASKS: dict[str, TaskSpec] = {}


def register_task(name: str, *, kind: Kind, meta_keys: Sequence[str] = (), column: str = "",
                  target: Callable[[Record], Any] | None = None, classes: Sequence[str] = (),
                  to_class: Callable[[Any], str | None] | None = None, unit: str = "",
                  plausible: tuple[float, float] | None = None, description: str = "") -> TaskSpec:
    """Register a task (see TaskSpec); ValueError for a bad name, kind or class list, or a name
    registered by another definition (registering the same definition again is a no-op)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"task name {name!r}: lower-case letters, digits and '_' (it is a config value)")
    if kind not in KINDS:
        raise ValueError(f"task {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "binary" and len(classes) != 2:
        raise ValueError(f"task {name!r}: a binary task names its two classes (negative, positive)")
    if kind != LABELS and not (meta_keys or column or target):
        raise ValueError(f"task {name!r}: say where its targets come from (meta_keys, column or target)")
    if plausible is not None and not plausible[0] < plausible[1]:
        raise ValueError(f"task {name!r}: plausible range {plausible} is empty")
    spec = TaskSpec(name, kind, tuple(meta_keys), column, target, tuple(classes), to_class, unit,
                    None if plausible is None else (float(plausible[0]), float(plausible[1])), description)
    known = TASKS.get(name)
    if known is not None and known != spec:
        raise ValueError(f"task {name!r} is already registered with another definition")
    TASKS[name] = spec
    return spec


def task_spec(name: str) -> TaskSpec:
    """The registered task `name`; ValueError naming the known ones (a plugin's goes in `plugins`)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))} "
                         "(a plugin's module goes in the config's plugins)")
    return TASKS[name]


def task_names() -> list[str]:
    return list(TASKS)


def corpus_task(manifest: dict[str, Any]) -> dict[str, Any]:
    """A corpus's task as its manifest records it; a corpus built before tasks existed (or of its
    source's own statements) is the "labels" task of its class names."""
    task = manifest.get("task")
    if task:
        return dict(task)
    return {"name": LABELS, "kind": LABELS}


def is_regression(manifest: dict[str, Any]) -> bool:
    return corpus_task(manifest).get("kind") == "regression"


def is_regression_task(name: str) -> bool:
    """Whether `finetune.task` (the corpus's task, recorded in a run's config) is a regression: a
    labels-CSV column task, or a registered task of that kind ("" = the corpus's statements)."""
    if not name or name == LABELS:
        return False
    return name.startswith(COLUMN_PREFIX) or task_spec(name).regression


# ---------------------------------------------------------------------------- corpora of a task


def _sex_class(value: Any) -> str | None:
    """PTB-XL's 0 male / 1 female, CinC 2021's "Male"/"Female"/"M"/"F", CODE-15%'s is_male bool."""
    if isinstance(value, bool):
        return "male" if value else "female"
    text = str(value).strip().lower()
    return {"0": "male", "1": "female", "male": "male", "female": "female", "m": "male",
            "f": "female"}.get(text)


def _is_male_to_sex(record: Record) -> Any:
    """Sex from meta "sex" (PTB-XL, CinC 2021) or CODE-15%'s "is_male" (True/False)."""
    if not _missing(record.meta.get("sex")):
        return record.meta["sex"]
    male = record.meta.get("is_male")
    return None if male is None else bool(male)


register_task(LABELS, kind=LABELS, description="the source's own diagnostic statements (multi- or single-label)")
# PTB-XL stores 300 for every patient over 89 (its privacy rule): out of range, so quarantined
register_task("age", kind="regression", meta_keys=("age",), unit="years", plausible=(0.0, 120.0),
              description="age at recording (PTB-XL, CODE-15%, CinC 2021 headers)")
register_task("height", kind="regression", meta_keys=("height",), unit="cm", plausible=(40.0, 250.0),
              description="body height (PTB-XL)")
register_task("weight", kind="regression", meta_keys=("weight",), unit="kg", plausible=(2.0, 300.0),
              description="body weight (PTB-XL)")
register_task("sex", kind="binary", target=_is_male_to_sex, classes=("female", "male"), to_class=_sex_class,
              description="sex as recorded (PTB-XL, CODE-15%, CinC 2021 headers); positive class: male")


def csv_column_values(path: str | Path, column: str) -> dict[str, str]:
    """{record_id: the column's cell} of a labels CSV (a `record_id` column and `column`);
    ValueError naming the file when either column is missing."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"labels table not found: {p}")
    with open(p, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("record_id", column) if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{p}: missing column(s) {missing} for the task; has {reader.fieldnames}")
        out = {}
        for row in reader:
            rid = (row["record_id"] or "").strip()
            out[rid] = row[column]
            stem = rid.rsplit(".", 1)[0] if "." in rid else rid
            out.setdefault(stem, row[column])
        return out


COLUMN_PREFIX = "column:"      # task=column:<name>: a numeric column of the labels CSV, a regression task


class TaskSource:
    """A source reader whose records carry a task's target (`TaskSpec.apply`): what `get_source`
    builds for `task=<a registered task other than labels>`. Listing, patient ids and every other
    attribute are the reader's own; class names are the task's (binary: its two classes;
    regression: its name), never multi-label.

    `column_values`: a labels-CSV column's cells by record id (column tasks)."""

    def __init__(self, reader: Any, task: TaskSpec, column_values: dict[str, str] | None = None):
        self.reader, self.task, self.column_values = reader, task, column_values
        self.name = reader.name
        self.class_names = task.class_names
        self.multilabel = False

    def __getattr__(self, item: str) -> Any:
        if item in ("reader", "task", "column_values"):      # not set yet (unpickling)
            raise AttributeError(item)
        return getattr(self.reader, item)

    def list_records(self, root):
        return self.reader.list_records(root)

    def read(self, ref) -> Record:
        record = self.reader.read(ref)
        if self.column_values is not None:
            values = self.column_values
            if record.record_id not in values and ref.record_id in values:
                values = {record.record_id: values[ref.record_id]}
            return self.task.apply(record, values)
        return self.task.apply(record)


def split_task_options(reader_cls: type, options: dict[str, Any],
                       label_free: dict[str, Any] | None) -> tuple[TaskSpec | None, dict[str, Any]]:
    """(the target task `options["task"]` names, or None; the reader's constructor options).

    A registered task other than "labels" is the corpus's task: the reader is built in its
    label-free view (`label_free`, the source's registered options) without "task". "labels" and
    "" mean the reader's own statements; a reader with a `task` option of its own (PTB-XL's
    statement tasks) keeps any other value. ValueError for an unknown task naming the known ones."""
    if "task" not in options:
        return None, options
    name = options["task"]
    takes_task = "task" in inspect.signature(reader_cls.__init__).parameters
    if isinstance(name, str) and name.startswith(COLUMN_PREFIX):
        if not options.get("labels"):
            raise ValueError(f"task {name!r}: a column task reads the labels CSV (set labels=<csv>)")
        column = name[len(COLUMN_PREFIX):]
        spec = TaskSpec(f"{COLUMN_PREFIX}{column}", "regression", column=column,
                        description=f"column {column!r} of {Path(options['labels']).name}")
        rest = {k: v for k, v in options.items() if k != "task"}
        rest.update(label_free or {})
        return spec, rest
    if name in TASKS and TASKS[name].kind != LABELS:
        spec = TASKS[name]
        if label_free is None:
            raise ValueError(f"task {name!r}: this source has no label-free view to read its records without "
                             "their statements")
        rest = {k: v for k, v in options.items() if k != "task"}
        rest.update(label_free)
        if takes_task:
            rest.pop("task", None)
        return spec, rest
    if name in ("", LABELS):
        if takes_task:
            return None, {k: v for k, v in options.items() if not (k == "task" and v in ("", LABELS))}
        return None, {k: v for k, v in options.items() if k != "task"}
    if takes_task:
        return None, options                   # the reader checks its own statement tasks
    raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))} (a labels-CSV column is a "
                     "task once registered: coreecg.data.tasks.register_task(..., column=...), or task=column:<name>)")
