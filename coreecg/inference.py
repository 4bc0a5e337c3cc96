"""Inference without Ray: raw ECG recordings in, class probabilities or embeddings per record out.

    from coreecg.hub import load_model
    from coreecg.inference import list_inputs, run_inference

    loaded = load_model("runs/ft-ptbxl")                  # a run folder, best.pt, encoder.pt or an export
    items, failures = list_inputs(["../shared/ecg-data/ptbxl", "more/records/"], loaded.config)
    result = run_inference(loaded, items, failures=failures)
    result.probs        # (records, classes) for a classifier; result.embeddings for an encoder
    result.failures     # [Failure(record_id, path, reason)]: the rest went on

Every step is the training code's own, so a record scores exactly as the fine-tuning evaluation
scored it (predictions.csv) when it is the same recording:

1. listing     a folder of a database with its own reader (an index file `known_layout` names:
               PTB-XL, MIMIC-IV-ECG, CPSC2018) goes through that reader, in its label-free view
               (record ids as the corpus has them); any other folder through the generic WFDB
               reader (`WfdbFolderSource`); a file is one WFDB record (`.hea`, `.dat`, `.mat`).
2. preprocess  `coreecg.data.preprocess.preprocess_record` with the model's config's preprocess
               section (as hub.load_model resolves it: the corpus's settings the weights saw),
               its leads narrowed to the model's leads: leads are picked BY NAME, so a 6-lead
               model takes I, II, III, aVR, aVL, aVF from a file in any lead order, and a record
               without one of them fails with "missing lead(s) ...".
3. storage     windows are rounded to the corpus's storage dtype (float16), as training and the
               evaluation read them: the inputs the weights saw (the rounding is ~2e-4 of a
               z-scored sample; with it, scores equal predictions.csv to its printed digits).
4. model       `coreecg.eval.downstream.predict`: the crop rule (mean of the logits of
               `eval_crops` evenly spaced crops of each window, then softmax / sigmoid), batched
               over windows; an encoder gives the crop mean of its pooled tokens instead.
5. record      `coreecg.eval.metrics.aggregate_by_record`: the mean over a record's windows.

A record that cannot be read or preprocessed is a `Failure` with the reader's or preprocessing's
reason; the others go on. Progress goes to the `coreecg.inference` logger every few seconds.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from coreecg.config import STANDARD_LEADS, Config, PreprocessConfig
from coreecg.data.corpus import SIGNAL_DTYPE
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import RecordError, RecordRef
from coreecg.data.sources import get_source
from coreecg.data.sources.base import DATA_SUFFIXES, Source, no_header_ref, walk
from coreecg.data.sources.wfdb_generic import WfdbFolderSource, known_layout
from coreecg.devices import resolve_device
from coreecg.files import write_atomic

log = logging.getLogger("coreecg.inference")

PREDICTIONS_FILE = "predictions.csv"
EMBEDDINGS_FILE = "embeddings.parquet"
FAILED_FILE = "failed.csv"


class InferenceError(ValueError):
    """A model or a setting inference cannot work with (named; nothing was predicted)."""


@dataclass(frozen=True)
class InputRecord:
    """One listed recording: its ref and the reader that reads it."""

    ref: RecordRef
    source: Source

    @property
    def record_id(self) -> str:
        return self.ref.record_id


@dataclass(frozen=True)
class Failure:
    """A record (or an input path) that gave no prediction, and why."""

    record_id: str
    path: str
    reason: str


@dataclass
class InferenceResult:
    """Per-record outputs, in listing order (failed records left out).

    record_id, path: (m,) each; probs: (m, K) float64 class probabilities (classifier, else None);
    embeddings: (m, D) float32 pooled embeddings (an encoder, or asked for, else None);
    windows: (m,) windows per record; class_names: K names; failures: what gave no output.
    """

    record_id: list[str]
    path: list[str]
    probs: np.ndarray | None
    embeddings: np.ndarray | None
    windows: np.ndarray
    class_names: tuple[str, ...]
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0


# ---------------------------------------------------------------------------- what the model takes


@dataclass(frozen=True)
class ModelInput:
    """What one loaded model needs, from its config and contract (`input_spec`).

    preprocess: the config's preprocess section with `leads` = the model's leads (row order).
    crop: samples per model input; n_crops: evaluation crops per window; precision: autocast.
    """

    kind: str
    leads: tuple[str, ...]
    preprocess: PreprocessConfig
    crop: int
    n_crops: int
    precision: str
    class_names: tuple[str, ...]
    multilabel: bool | None
    batch_size: int


def input_spec(loaded: Any) -> ModelInput:
    """A `coreecg.hub.LoadedModel` -> ModelInput; InferenceError where config and contract disagree.

    The preprocess section is the config's (hub resolves it to the corpus's settings); the contract
    names the leads, the stored window and the crop rule, and both must say the same.
    """
    cfg: Config = loaded.config
    c: dict[str, Any] = loaded.contract or {}
    kind = loaded.kind
    if kind not in ("encoder", "classifier"):
        raise InferenceError(f"{loaded.source}: unknown model kind {kind!r}")
    if kind == "classifier":
        leads = tuple(getattr(loaded.model, "leads", None) or c.get("leads") or cfg.finetune.leads)
    else:
        leads = tuple(c.get("leads") or STANDARD_LEADS[: cfg.model.n_leads])
    if c.get("leads") and tuple(c["leads"]) != leads:
        raise InferenceError(f"{loaded.source}: the model takes leads {list(leads)}, its contract says {c['leads']}")
    pre = dataclasses.replace(cfg.data.preprocess, leads=leads)
    checks = {"sampling_rate": pre.sampling_rate, "stored_window_samples": pre.window_samples,
              "window_samples": cfg.model.input_samples}
    wrong = [f"{k}: contract {c[k]}, config {v}" for k, v in checks.items() if k in c and c[k] != v]
    if wrong:
        raise InferenceError(f"{loaded.source}: contract and config disagree ({'; '.join(wrong)})")
    if cfg.model.input_samples > pre.window_samples:
        raise InferenceError(f"{loaded.source}: the model takes {cfg.model.input_samples} samples, longer than "
                             f"a preprocessed window ({pre.window_samples})")
    n_crops = int((c.get("aggregation") or {}).get("eval_crops") or cfg.finetune.eval_crops)
    names: tuple[str, ...] = ()
    multilabel = None
    if kind == "classifier":
        names, multilabel = tuple(c.get("class_names") or ()), c.get("multilabel")
        if not names or multilabel is None:
            raise InferenceError(f"{loaded.source}: a classifier without class names or task in its contract")
    return ModelInput(kind, leads, pre, cfg.model.input_samples, n_crops, cfg.train.precision, names,
                      None if multilabel is None else bool(multilabel), cfg.finetune.eval_batch_size)


class _PooledEncoder(nn.Module):
    """An Encoder seen through the three methods `downstream.predict` calls on a Classifier:
    features = pooled tokens of the given leads, an empty head, identity probabilities. So an
    embedding goes through the same crops and batching as a classifier's scores."""

    def __init__(self, encoder: nn.Module, leads: Sequence[str]):
        super().__init__()
        self.encoder = encoder
        self.register_buffer("lead_idx", torch.tensor([STANDARD_LEADS.index(x) for x in leads]), persistent=False)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, len(leads), T) -> (B, D)."""
        return self.encoder.pooled(x, self.lead_idx)

    def head(self, f: torch.Tensor) -> torch.Tensor:
        return f[:, :0]                           # (B, 0): no classes

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


# ---------------------------------------------------------------------------- listing


def source_options(config: Config | None = None) -> dict[str, dict[str, Any]]:
    """Reader options for the databases listed by their own reader: label-free views (inference
    needs no labels, and a labelled view refuses records outside its task), the config's rate."""
    rate = config.data.sources.ptbxl.rate if config is not None else 500
    return {"ptbxl": {"label_view": "none", "rate": rate}, "cpsc2018": {"label_view": "none"},
            "mimic-iv-ecg": {}}


def list_inputs(paths: Iterable[str | Path], config: Config | None = None,
                options: dict[str, dict[str, Any]] | None = None) -> tuple[list[InputRecord], list[Failure]]:
    """Files and folders -> (records in order, inputs that gave none), each path listed once.

    A folder: a known database layout (its index file, at the folder or below it) through its own
    reader; everything else below it through the generic WFDB reader, with record ids relative to
    the folder. A file: a WFDB record by its `.hea`, `.dat` or `.mat` (a data file without header
    is listed and fails with "no header"), or a known index file (its folder is read). A missing
    path or a folder with no record is a Failure.
    """
    options = options if options is not None else source_options(config)
    items: list[InputRecord] = []
    failures: list[Failure] = []
    for p in paths:
        path = Path(p).expanduser()
        try:
            if path.is_dir():
                found = _list_folder(path, options)
                if not found:
                    raise ValueError(f"no records under {path} (no .hea or {'/'.join(DATA_SUFFIXES)} files)")
                items += found
            elif path.is_file() and known_layout(path) is not None:
                items += _list_folder(path.parent, options)     # an index file: its database
            elif path.is_file():
                items.append(_file_record(path))
            else:
                failures.append(Failure(str(p), str(p), "no such file or folder"))
        except (ValueError, OSError) as e:      # a listing error of a reader: the whole input
            failures.append(Failure(str(p), str(p), f"cannot list: {e}"))
    seen: set[str] = set()
    unique = []
    for it in items:                           # a record given twice (its folder and itself): the first
        key = str(Path(it.ref.path).resolve())
        if key not in seen:
            seen.add(key)
            unique.append(it)
    return unique, failures


def _list_folder(root: Path, options: dict[str, dict[str, Any]]) -> list[InputRecord]:
    """A folder's records: known layouts by their reader, the rest by the generic one."""
    layouts = {folder: name for folder, files in walk(root) for f in files
               if (name := known_layout(folder / f)) is not None}
    generic = WfdbFolderSource()

    def visit(folder: Path) -> list[InputRecord]:
        if folder in layouts:
            src = get_source(layouts[folder], **options.get(layouts[folder], {}))
            return [InputRecord(r, src) for r in src.list_records(folder)]
        if not any(folder in d.parents for d in layouts):
            try:
                refs = generic.list_records(folder)
            except ValueError:                 # a folder of other files (csv tables, .h5) inside a tree
                return []
            prefix = folder.relative_to(root)
            return [InputRecord(dataclasses.replace(r, record_id=str(prefix / r.record_id)), generic) for r in refs]
        # A layout lies deeper: this folder's own headers one by one, then each subfolder.
        out = [_file_record(f, record_id=str(f.relative_to(root).with_suffix("")))
               for f in sorted(folder.glob("*.hea"))]
        for sub in sorted(d for d in folder.iterdir() if d.is_dir()):
            out += visit(sub)
        return out

    return visit(root)


def _file_record(path: Path, record_id: str | None = None) -> InputRecord:
    """One file given by name -> its record (ValueError for a file that names none)."""
    generic = WfdbFolderSource()
    suffix = path.suffix.lower()
    if suffix == ".hea" or (suffix in DATA_SUFFIXES and path.with_suffix(".hea").is_file()):
        stem = path.with_suffix("")
        return InputRecord(RecordRef(generic.name, record_id or stem.name, str(stem), {}), generic)
    if suffix in DATA_SUFFIXES:                # read() fails it with the reader's "no header" reason
        return InputRecord(no_header_ref(generic.name, record_id or path.name, path), generic)
    raise ValueError(f"not a WFDB record (.hea, {', '.join(DATA_SUFFIXES)}) or a folder")


# ---------------------------------------------------------------------------- running


def prepare(item: InputRecord, preprocess: PreprocessConfig) -> np.ndarray:
    """Read and preprocess one record -> (n_windows, leads, window_samples) in the storage dtype.

    Raises RecordError with the reader's or preprocessing's reason.
    """
    record = item.source.read(item.ref)
    # Rounded to the corpus's storage dtype: the windows the weights were trained and scored on.
    return preprocess_record(record, preprocess).astype(SIGNAL_DTYPE)


def _prepared(items: Sequence[InputRecord], preprocess: PreprocessConfig
              ) -> Iterator[tuple[int, np.ndarray | None, Failure | None]]:
    """(index, windows, None) or (index, None, Failure) per item, in order (reasons as the corpus
    pipeline's quarantine gives them)."""
    for i, item in enumerate(items):
        try:
            windows, failure = prepare(item, preprocess), None
        except RecordError as e:
            windows, failure = None, Failure(item.record_id, e.path or item.ref.path, e.reason)
        except Exception as e:                  # a reader bug or an unforeseen format: still only this record
            windows, failure = None, Failure(item.record_id, item.ref.path, f"unreadable ({type(e).__name__}: {e})")
        yield i, windows, failure


class _Progress:
    """A log line every `every_s` seconds: records done / total, records/s, ETA."""

    def __init__(self, total: int, every_s: float):
        self.total, self.every_s = total, every_s
        self.t0 = self.last = time.perf_counter()

    def update(self, done: int, failed: int, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else math.inf
        log.info("predict: %d/%d records (%d failed), %.1f records/s, ETA %s", done, self.total, failed, rate,
                 "-" if not math.isfinite(eta) else f"{eta:.0f} s")


def run_inference(loaded: Any, items: Sequence[InputRecord], *, embeddings: bool = False,
                  batch_size: int | None = None, device: str | torch.device = "cpu",
                  failures: Sequence[Failure] = (), progress_every_s: float = 5.0) -> InferenceResult:
    """Score `items` with a `coreecg.hub.LoadedModel`; one record's failure never stops the rest.

    A classifier gives probs (m, K) (softmax or sigmoid, as the evaluation); an encoder, or any
    model with `embeddings`, gives embeddings (m, D): the pooled tokens, crop- and window-mean.
    Windows of whole records are gathered until `batch_size` windows wait, then scored together
    (`batch_size` windows per forward pass, x n_crops crops; default the config's
    finetune.eval_batch_size). `failures` (from listing) are carried into the result.
    """
    from coreecg.eval.downstream import predict
    from coreecg.eval.metrics import aggregate_by_record

    spec = input_spec(loaded)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    batch = int(batch_size or spec.batch_size)
    if batch < 1:
        raise InferenceError(f"batch size {batch} must be >= 1")
    model = loaded.model if spec.kind == "classifier" else _PooledEncoder(loaded.model, spec.leads)
    model = model.to(dev).eval()
    want_probs, want_emb = spec.kind == "classifier", embeddings or spec.kind == "encoder"
    rows = list(range(len(spec.leads)))

    probs: dict[int, np.ndarray] = {}
    embs: dict[int, np.ndarray] = {}
    n_windows: dict[int, int] = {}
    failed = list(failures)
    pending: list[tuple[int, np.ndarray]] = []      # whole records waiting for the model
    waiting = 0                                      # their windows
    progress = _Progress(len(items), progress_every_s)
    t0 = time.perf_counter()
    log.info("predict: %d records with %s (%s, leads %s, %d crops of %d samples per %d-sample window) on %s",
             len(items), loaded.source, spec.kind, ",".join(spec.leads), spec.n_crops, spec.crop,
             spec.preprocess.window_samples, dev)

    def flush() -> None:
        nonlocal waiting
        signal = np.concatenate([w for _, w in pending])                          # (n, C, T) float16
        keys = np.repeat([i for i, _ in pending], [len(w) for _, w in pending])   # record of each window
        p, f = predict(model, signal, rows, spec.crop, spec.n_crops, dev, batch, spec.precision)
        if want_probs:
            ids, mean = aggregate_by_record(keys, p)
            probs.update(zip(ids, mean))
        if want_emb:
            ids, mean = aggregate_by_record(keys, f)
            embs.update(zip(ids, mean.astype(np.float32)))
        n_windows.update((i, len(w)) for i, w in pending)
        pending.clear()
        waiting = 0

    done = 0
    for i, windows, failure in _prepared(items, spec.preprocess):
        if failure is not None:
            failed.append(failure)
            done += 1
        else:
            pending.append((i, windows))
            waiting += len(windows)
            if waiting >= batch:
                done += len(pending)
                flush()
        progress.update(done, len(failed) - len(failures))
    if pending:
        done += len(pending)
        flush()
    progress.update(done, len(failed) - len(failures), force=True)

    order = [i for i in range(len(items)) if i in n_windows]
    seconds = time.perf_counter() - t0
    log.info("predict: %d records scored (%d windows), %d failed, in %.1f s", len(order),
             sum(n_windows.values()), len(failed), seconds)
    k, d = len(spec.class_names), int(model.encoder.dim)
    return InferenceResult(
        record_id=[items[i].record_id for i in order], path=[items[i].ref.path for i in order],
        probs=np.asarray([probs[i] for i in order], dtype=np.float64).reshape(len(order), k) if want_probs else None,
        embeddings=(np.asarray([embs[i] for i in order], dtype=np.float32).reshape(len(order), d)
                    if want_emb else None),
        windows=np.asarray([n_windows[i] for i in order], dtype=np.int64),
        class_names=spec.class_names, failures=failed, seconds=seconds)


def predict_paths(model: str | Path, inputs: Iterable[str | Path], *, embeddings: bool = False,
                  batch_size: int | None = None, device: str = "cpu",
                  progress_every_s: float = 5.0) -> InferenceResult:
    """load_model + list_inputs + run_inference (InferenceError / CheckpointError for a bad model)."""
    from coreecg.hub import load_model

    loaded = load_model(model)
    items, failures = list_inputs(inputs, loaded.config)
    return run_inference(loaded, items, embeddings=embeddings, batch_size=batch_size, device=device,
                         failures=failures, progress_every_s=progress_every_s)


# ------------------------------------------------------------ outputs (each written whole: coreecg.files)


def write_predictions_csv(path: str | Path, result: InferenceResult) -> Path:
    """record_id, path, then p_<class> per class, formatted as the fine-tuning run's
    predictions.csv writes them (`coreecg.eval.downstream.write_predictions`)."""
    import csv

    if result.probs is None:
        raise InferenceError("no class probabilities to write (the model is an encoder)")

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["record_id", "path", *(f"p_{c}" for c in result.class_names)])
            for rid, rpath, p in zip(result.record_id, result.path, result.probs):
                w.writerow([rid, rpath, *(f"{v:.8g}" for v in p)])

    return write_atomic(path, write)


def write_embeddings_parquet(path: str | Path, result: InferenceResult, metadata: dict[str, str] | None = None
                             ) -> Path:
    """record_id, path, embedding (fixed_size_list<float32>[D]) per record; `metadata` in the schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if result.embeddings is None:
        raise InferenceError("no embeddings to write")
    emb = np.ascontiguousarray(result.embeddings, dtype=np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
    table = pa.table({"record_id": pa.array(result.record_id, pa.string()),
                      "path": pa.array(result.path, pa.string()), "embedding": column})
    if metadata:
        table = table.replace_schema_metadata({k: str(v) for k, v in metadata.items()})
    return write_atomic(path, lambda tmp: pq.write_table(table, str(tmp)))


def write_failures_csv(path: str | Path, failures: Sequence[Failure]) -> Path:
    """record_id, path, reason: the columns of a corpus's quarantine.csv."""
    import csv


    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["record_id", "path", "reason"])
            w.writerows([x.record_id, x.path, x.reason] for x in failures)

    return write_atomic(path, write)


__all__ = ["InputRecord", "Failure", "InferenceResult", "InferenceError", "ModelInput", "input_spec",
           "source_options", "list_inputs", "prepare", "run_inference", "predict_paths",
           "write_predictions_csv", "write_embeddings_parquet", "write_failures_csv",
           "PREDICTIONS_FILE", "EMBEDDINGS_FILE", "FAILED_FILE"]
