"""The source registry: a source's name -> its reader class, its options section, the index file
that marks its downloads, its label-free view and its dataset key and table label. Built-ins and
plugins alike declare all of it with `register_source` on the reader class, in the reader's module.

    @register_source("toy_db", options=ToyOptions, index_file=IndexFile("toy_index.csv", ("record",)),
                     label_free={"label_view": "none"}, dataset_label="Toy DB")
    class ToySource: ...

Who reads it: the config (`data.sources.<name>`, through its options), the pipeline
(`get_source`, the dataset key and label it records in a corpus manifest), the generic `wfdb`
reader and inference (`layout_source`: which folder belongs to which reader), fine-tuning and the
report (`dataset_key`, `dataset_labels`, `dataset_aliases`).

This module sits in the config's layer (tests/test_data_layering.py): it imports no reader and
no config. Importing it runs `coreecg.data.sources` first, whose built-in readers register
themselves, so a lookup here always sees them.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

# The paper's datasets, in its tables' order: report columns list these first.
PAPER_DATASETS = ("ptbxl", "icbeb2018", "ningbo")
_NAME = re.compile(r"[a-z][a-z0-9_-]*")


@dataclass(frozen=True)
class IndexFile:
    """A file that marks a folder as one source's download: the generic `wfdb` reader refuses such
    a folder naming the source, and inference lists it with that source's reader.

    name: the file's name; columns: words its first line must hold (a generic name such as
    REFERENCE.csv marks the folder only with them); lost: what the generic reader would lose.
    """

    name: str
    columns: tuple[str, ...] = ()
    lost: str = "its labels and patient ids would be lost"

    def marks(self, path: Path) -> bool:
        """Whether `path` is this index file (its header read only where `columns` are asked)."""
        if path.name != self.name:
            return False
        if not self.columns:
            return True
        try:
            with open(path, errors="replace") as f:
                first = f.readline()
        except OSError:
            return False
        return all(c in first for c in self.columns)


@dataclass(frozen=True)
class SourceSpec:
    """One registered source (see `register_source` for the fields)."""

    name: str
    cls: type
    options: type | None = None
    index_file: IndexFile | None = None
    label_free: Mapping[str, Any] | Callable[[Any], dict[str, Any]] | None = None
    dataset_key: Callable[[dict[str, Any]], str] | None = None
    dataset_labels: Mapping[str, str] = field(default_factory=dict)
    dataset_aliases: Mapping[str, str] = field(default_factory=dict)

    def reader_options(self, section: Any, data: Any) -> dict[str, Any]:
        """Constructor options from the source's section (`data.sources.<name>`) of the data
        section `data`: its `reader_options(data)` if it has one, else its fields."""
        if section is None:
            return {}
        own = getattr(section, "reader_options", None)
        return dict(own(data)) if callable(own) else dataclasses.asdict(section)

    def label_free_options(self, section: Any) -> dict[str, Any] | None:
        """Constructor options of a view without labels (inference lists any record), or None."""
        if self.label_free is None:
            return None
        return dict(self.label_free(section) if callable(self.label_free) else self.label_free)

    def key(self, manifest: dict[str, Any]) -> str:
        """The dataset key of a corpus of this source, from its manifest."""
        return str(self.dataset_key(manifest)) if self.dataset_key is not None else self.name


# The registry, in registration order (the built-ins first), and index file name -> specs.
SOURCES: dict[str, SourceSpec] = {}
_INDEX_FILES: dict[str, list[SourceSpec]] = {}


def register_source(name: str, *, options: type | None = None, index_file: IndexFile | str | None = None,
                    label_free: Mapping[str, Any] | Callable[[Any], dict[str, Any]] | None = None,
                    dataset_key: Callable[[dict[str, Any]], str] | None = None,
                    dataset_label: str | Mapping[str, str] | None = None,
                    dataset_aliases: Mapping[str, str] | None = None) -> Callable[[type], type]:
    """Class decorator: the reader class of source `name` (`get_source(name, **options)` builds it).

    options: a dataclass, the typed config section `data.sources.<name>` (its `__post_init__`
        checks its keys); its optional `reader_options(self, data)` turns it into constructor
        options (`data`: the config's data section), else its fields are passed as they are.
    index_file: the file that marks this source's download folders (an `IndexFile`, or a name).
    label_free: constructor options of a view without labels, for inference and embedding (a
        mapping, or a function of the source's options section); None: not listed by inference.
    dataset_key: manifest -> the dataset key fine-tuning runs and report tables use (default:
        `name`); recorded in the corpus manifest at build time.
    dataset_label: the key's name in tables (a string for the key `name`, or {key: label}).
    dataset_aliases: {key: the key a table files it under} (cpsc2018 -> icbeb2018).
    """
    def register(cls: type) -> type:
        if not isinstance(cls, type):
            raise TypeError(f"@register_source({name!r}) decorates a reader class, got {cls!r}")
        if not _NAME.fullmatch(name):
            raise ValueError(f"source name {name!r}: lower-case letters, digits, '_' and '-' (it is a config key)")
        if getattr(cls, "name", name) != name:
            raise ValueError(f"source {name!r}: {cls.__name__}.name is {cls.name!r}; a reader's name is its "
                             "registered name (records and manifests carry it)")
        if options is not None and not (isinstance(options, type) and dataclasses.is_dataclass(options)):
            raise ValueError(f"source {name!r}: options must be a dataclass, got {options!r}")
        known = SOURCES.get(name)
        if known is not None and _qualname(known.cls) != _qualname(cls):
            raise ValueError(f"source {name!r} is already registered by {_qualname(known.cls)}")
        cls.name = name
        labels = {name: dataset_label} if isinstance(dataset_label, str) else dict(dataset_label or {})
        index = IndexFile(index_file) if isinstance(index_file, str) else index_file
        _add(SourceSpec(name, cls, options, index, label_free, dataset_key, labels, dict(dataset_aliases or {})))
        return cls
    return register


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _add(spec: SourceSpec) -> None:
    SOURCES[spec.name] = spec
    for specs in _INDEX_FILES.values():
        specs[:] = [s for s in specs if s.name != spec.name]
    if spec.index_file is not None:
        _INDEX_FILES.setdefault(spec.index_file.name, []).append(spec)


# ---------------------------------------------------------------------------- lookups


def source_specs() -> dict[str, SourceSpec]:
    """Every registered source, built-ins first (plugins: once their module is imported)."""
    return SOURCES


def source_spec(name: str) -> SourceSpec:
    """The registered source `name`; ValueError naming the known ones otherwise."""
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r}; known: {', '.join(sorted(SOURCES))} "
                         "(a plugin's module goes in the config's plugins)")
    return SOURCES[name]


def reader_options(name: str, data: Any) -> dict[str, Any]:
    """Constructor options of source `name` from a config's data section (`data.sources.<name>`)."""
    spec = source_spec(name)
    return spec.reader_options(getattr(data.sources, name) if spec.options is not None else None, data)


def layout_source(path: Path) -> str | None:
    """The source whose index file `path` is, or None."""
    for spec in _INDEX_FILES.get(path.name, ()):
        if spec.index_file.marks(path):
            return spec.name
    return None


def label_free_options(config: Any = None) -> dict[str, dict[str, Any]]:
    """{source: constructor options of its label-free view} for every source that has one, the
    config's options sections applied (defaults when `config` is None)."""
    out = {}
    for name, spec in SOURCES.items():
        if spec.label_free is None:
            continue
        section = None
        if spec.options is not None:
            section = getattr(config.data.sources, name) if config is not None else spec.options()
        out[name] = spec.label_free_options(section)
    return out


# ---------------------------------------------------------------------------- datasets


def dataset_key(manifest: dict[str, Any]) -> str:
    """The dataset key of a corpus: the one its manifest recorded at build time, else (a corpus
    built before keys were recorded) its source's rule, else its source's name."""
    recorded = manifest.get("dataset_key")
    if recorded:
        return str(recorded)
    spec = SOURCES.get(manifest["source"])
    return spec.key(manifest) if spec is not None else str(manifest["source"])


def dataset_label(manifest: dict[str, Any]) -> str | None:
    """The table label of a corpus's dataset: the one its manifest recorded, else the registry's
    (None: tables print the key)."""
    if "dataset_label" in manifest:
        return manifest["dataset_label"]
    key = dataset_key(manifest)
    return dataset_labels().get(dataset_aliases().get(key, key))


def dataset_labels() -> dict[str, str]:
    """{dataset key: its name in tables}: the paper's datasets first, in its order, then the
    registered sources' in registration order."""
    labels: dict[str, str] = {}
    for spec in SOURCES.values():
        labels.update({k: v for k, v in spec.dataset_labels.items() if k not in labels})
    paper = [k for k in PAPER_DATASETS if k in labels]
    return {k: labels[k] for k in [*paper, *(k for k in labels if k not in paper)]}


def dataset_aliases() -> dict[str, str]:
    """{dataset key: the key its runs are filed under in tables} (cpsc2018 -> icbeb2018)."""
    return {k: v for spec in SOURCES.values() for k, v in spec.dataset_aliases.items()}
