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
               A coreecg corpus folder (manifest.json) is listed as its shard files
               (`CorpusShard`): its windows are already steps 2-3, so they are scored as stored.
2. preprocess  `coreecg.data.preprocess.preprocess_record` with the model's config's preprocess
               section (as hub.load_model resolves it: the corpus's settings the weights saw),
               its leads narrowed to the model's leads: leads are picked BY NAME, so a 6-lead
               model takes I, II, III, aVR, aVL, aVF from a file in any lead order, and a record
               without one of them fails with "missing lead(s) ...".
3. storage     windows are rounded to the corpus's storage dtype (float16), as training and the
               evaluation read them: the inputs the weights saw (the rounding is ~2e-4 of a
               z-scored sample; with it, scores equal predictions.csv to its printed digits).
4. model       `coreecg.eval.downstream.predict`: the crop rule (mean of the logits of
               `eval_crops` evenly spaced crops of each window, then softmax / sigmoid), in
               forward passes of exactly `batch_size` windows (run_inference says why); an
               encoder gives the crop mean of its pooled tokens instead.
5. record      `coreecg.eval.metrics.aggregate_by_record`: the mean over a record's windows.

A record that cannot be read or preprocessed is a `Failure` with the reader's or preprocessing's
reason; the others go on. Progress goes to the `coreecg.inference` logger every few seconds.

`embed(signal, fs, leads, model)` / `predict(...)` run one in-memory recording through the same
steps 2-5 (a `Record` is an item like a listed file). This module never imports Ray: the same
per-record work spread over a cluster is `coreecg.inference_ray`.
"""
from __future__ import annotations

import dataclasses
import functools
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
from coreecg.data.corpus import SIGNAL_DTYPE, decode_signals, load_manifest, read_shard, split_files
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import Record, RecordError, RecordRef
from coreecg.data.sources import get_source
from coreecg.data.sources.base import DATA_SUFFIXES, Source, no_header_ref, walk
from coreecg.data.sources.wfdb_generic import WfdbFolderSource, known_layout
from coreecg.devices import resolve_device
from coreecg.files import write_atomic

log = logging.getLogger("coreecg.inference")

PREDICTIONS_FILE = "predictions.csv"
EMBEDDINGS_FILE = "embeddings.parquet"
FAILED_FILE = "failed.csv"
# Windows per forward pass (x the crop rule's crops), always exactly this many (run_inference).
FORWARD_WINDOWS = 8


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
class CorpusShard:
    """One shard file of a coreecg corpus: its records' stored windows (already preprocessed and
    float16), scored as they are. shape (leads, samples), leads: the manifest's "signal";
    preprocess: its "preprocess" settings as (key, value) pairs."""

    path: str
    split: str
    shape: tuple[int, int]
    leads: tuple[str, ...]
    preprocess: tuple[tuple[str, Any], ...]


Item = InputRecord | CorpusShard | Record     # what run_inference scores (a Record: in memory)


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
    windows: (m,) windows per record; class_names: K names; failures: what gave no output
    (listing failures first, then records in item order). item: (m,) the index in the scored
    items of each record's item (a corpus shard gives many records; an item that gives none gave
    exactly one Failure).
    """

    record_id: list[str]
    path: list[str]
    probs: np.ndarray | None
    embeddings: np.ndarray | None
    windows: np.ndarray
    class_names: tuple[str, ...]
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    item: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


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
                      None if multilabel is None else bool(multilabel))


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
                options: dict[str, dict[str, Any]] | None = None, splits: Sequence[str] | None = None
                ) -> tuple[list[InputRecord | CorpusShard], list[Failure]]:
    """Files and folders -> (records in order, inputs that gave none), each path listed once.

    A coreecg corpus folder (manifest.json): its shard files of `splits` (default: every split,
    train/val/test order), each a CorpusShard.

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
            if path.is_dir() and (path / "manifest.json").is_file():
                items += list_corpus(path, splits)
            elif path.is_dir():
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
        key = str(Path(it.path if isinstance(it, CorpusShard) else it.ref.path).resolve())
        if key not in seen:
            seen.add(key)
            unique.append(it)
    return unique, failures


def list_corpus(corpus: str | Path, splits: Sequence[str] | None = None) -> list[CorpusShard]:
    """A corpus folder's shard files of `splits` (default all) in manifest order (CorpusError, a
    ValueError naming the folder, for a corpus that is unfinished or lacks a split)."""
    from coreecg.data.reading import splits_of

    manifest = load_manifest(corpus)
    sig = manifest["signal"]
    shape = tuple(int(n) for n in sig["shape"])
    settings = tuple(sorted(manifest["preprocess"].items()))
    return [CorpusShard(str(f), split, shape, tuple(sig["leads"]), settings)
            for split in (splits or splits_of(corpus, manifest)) for f in split_files(corpus, split, manifest)]


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


def prepare(item: InputRecord | Record, preprocess: PreprocessConfig) -> np.ndarray:
    """Read (a listed file) and preprocess one record -> (n_windows, leads, window_samples) in the
    storage dtype. Raises RecordError with the reader's or preprocessing's reason.
    """
    record = item if isinstance(item, Record) else item.source.read(item.ref)
    # Rounded to the corpus's storage dtype: the windows the weights were trained and scored on.
    return preprocess_record(record, preprocess).astype(SIGNAL_DTYPE)


# The preprocessing settings a stored window depends on: a corpus made otherwise is not the model's input.
_WINDOW_SETTINGS = ("sampling_rate", "window_s", "highpass_hz", "lowpass_hz", "filter_order", "zscore_eps",
                    "standardize")


def shard_windows(shard: CorpusShard, preprocess: PreprocessConfig) -> Iterator[tuple[str, np.ndarray]]:
    """A corpus shard -> (record_id, windows (n, len(preprocess.leads), T) float16) per record, in
    the order of the records' first windows; rows picked by lead name from the stored leads.

    Raises RecordError naming the shard when its windows are not the model's input (other
    preprocessing settings, a lead the model takes but the corpus lacks)."""
    stored = dict(shard.preprocess)
    stored.setdefault("standardize", "lead")                 # a corpus records it only when not the default
    want = preprocess.settings() | {"standardize": preprocess.standardize}
    wrong = [f"{k} {stored.get(k)} (the model's {want[k]})" for k in _WINDOW_SETTINGS if stored.get(k) != want[k]]
    if wrong:
        raise RecordError(shard.path, "corpus preprocessed otherwise than the model's input: " + ", ".join(wrong))
    missing = [x for x in preprocess.leads if x not in shard.leads]
    if missing:
        raise RecordError(shard.path, f"corpus lacks lead(s) {', '.join(missing)}")
    rows = [shard.leads.index(x) for x in preprocess.leads]
    table = read_shard(shard.path, ["record_id", "signal"])
    signal = decode_signals(table.column("signal"), shard.shape, SIGNAL_DTYPE, as_stored=True)
    groups: dict[str, list[int]] = {}
    for j, rid in enumerate(table.column("record_id").to_pylist()):
        groups.setdefault(rid, []).append(j)
    for rid, idx in groups.items():
        yield rid, signal[idx][:, rows]


def _prepared(items: Sequence[Item], preprocess: PreprocessConfig
              ) -> Iterator[tuple[int, str, str, np.ndarray | None, Failure | None]]:
    """(item index, record_id, path, windows, None) per record, or (index, id, path, None, Failure)
    for an item that gave none, in order (reasons as the corpus pipeline's quarantine gives them).
    Every item gives records or exactly one Failure: a shard without records (coreecg never writes
    one: a damaged or foreign file) is a Failure, so one process and Ray actors list it alike."""
    for i, item in enumerate(items):
        if isinstance(item, CorpusShard):
            rid = path = item.path                # a shard that cannot be read fails as a whole
        else:
            rid, path = item.record_id, item.path if isinstance(item, Record) else item.ref.path
        try:
            if isinstance(item, CorpusShard):
                records = 0
                for record_id, windows in shard_windows(item, preprocess):
                    records += 1
                    yield i, record_id, path, windows, None
                if not records:
                    yield i, rid, path, None, Failure(rid, path, "empty shard: no records")
            else:
                yield i, rid, path, prepare(item, preprocess), None
        except RecordError as e:
            yield i, rid, path, None, Failure(rid, e.path or path, e.reason)
        except Exception as e:                  # a reader bug or an unforeseen format: still only this record
            yield i, rid, path, None, Failure(rid, path, f"unreadable ({type(e).__name__}: {e})")


class Progress:
    """A log line every `every_s` seconds: records done / total, records/s, ETA."""

    def __init__(self, total: int, every_s: float):
        self.total, self.every_s = total, every_s
        self.t0 = self.last = time.perf_counter()
        self.shown: tuple[int, int] | None = None     # the last line's figures: the final line is not a repeat

    def update(self, done: int, failed: int, force: bool = False) -> None:
        now = time.perf_counter()
        if (now - self.last < self.every_s) if not force else (done, failed) == self.shown:
            return
        self.last, self.shown = now, (done, failed)
        rate = done / max(now - self.t0, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else math.inf
        log.info("predict: %d/%d inputs (%d failed), %.1f inputs/s, ETA %s", done, self.total, failed, rate,
                 "-" if not math.isfinite(eta) else f"{eta:.0f} s")


def run_inference(loaded: Any, items: Sequence[Item], *, embeddings: bool = False,
                  batch_size: int | None = None, device: str | torch.device = "cpu",
                  failures: Sequence[Failure] = (), progress_every_s: float = 5.0) -> InferenceResult:
    """Score `items` with a `coreecg.hub.LoadedModel`; one record's failure never stops the rest.

    A classifier gives probs (m, K) (softmax or sigmoid, as the evaluation); an encoder, or any
    model with `embeddings`, gives embeddings (m, D): the pooled tokens, crop- and window-mean.
    Items: listed files (InputRecord), corpus shards (their stored windows), or in-memory Records.
    `failures` (from listing) are carried into the result.

    The windows of consecutive records stream through forward passes of exactly `batch_size`
    windows (default FORWARD_WINDOWS; x the crops), the last one filled up with zero windows
    whose outputs are dropped. Why exactly: a matrix product's rows depend on how many rows it
    has (the CPU's BLAS picks other kernels for a few rows: the head's, an attention pool's), not
    on the other rows' values; with one shape for every pass, a record scores the same whatever
    records share its passes, so Ray actors (coreecg.inference_ray) give this process's outputs
    bit for bit (tests/test_inference_scale.py).
    """
    from coreecg.eval.downstream import predict

    spec = input_spec(loaded)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    batch = int(batch_size or FORWARD_WINDOWS)
    if batch < 1:
        raise InferenceError(f"batch size {batch} must be >= 1")
    model = loaded.model if spec.kind == "classifier" else _PooledEncoder(loaded.model, spec.leads)
    model = model.to(dev).eval()
    rows = list(range(len(spec.leads)))

    scored: list[tuple[int, str, str]] = []          # (item index, record_id, path) per record, in order
    failed = list(failures)
    stream = _PassStream(lambda x: predict(model, x, rows, spec.crop, spec.n_crops, dev, batch, spec.precision),
                         batch, (len(rows), spec.preprocess.window_samples))
    progress = Progress(len(items), progress_every_s)
    t0 = time.perf_counter()
    log.info("predict: %d inputs with %s (%s, leads %s, %d crops of %d samples per %d-sample window) on %s",
             len(items), loaded.source, spec.kind, ",".join(spec.leads), spec.n_crops, spec.crop,
             spec.preprocess.window_samples, dev)
    for i, rid, path, windows, failure in _prepared(items, spec.preprocess):
        if failure is not None:
            failed.append(failure)
        else:
            scored.append((i, rid, path))
            stream.add(windows)
        progress.update(i, len(failed) - len(failures))        # items begun (a shard holds many records)
    stream.close()
    progress.update(len(items), len(failed) - len(failures), force=True)

    seconds = time.perf_counter() - t0
    log.info("predict: %d records scored (%d windows), %d failed, in %.1f s", len(scored), stream.through,
             len(failed), seconds)
    return InferenceResult(
        record_id=[rid for _, rid, _ in scored], path=[path for _, _, path in scored],
        probs=stream.records(0, len(spec.class_names), np.float64) if spec.kind == "classifier" else None,
        embeddings=(stream.records(1, int(model.encoder.dim), np.float32)
                    if embeddings or spec.kind == "encoder" else None),
        windows=stream.windows(), class_names=spec.class_names, failures=failed,
        seconds=seconds, item=np.asarray([i for i, _, _ in scored], dtype=np.int64))


class _PassStream:
    """The windows of consecutive records through forward passes of exactly `batch` windows (the
    last one filled up with zero windows, their outputs dropped); each record is averaged over
    its windows (`aggregate_by_record`) as soon as they are all through, so memory holds a pass,
    not the corpus.

    score: (batch, C, T) windows -> (probs (batch, K), features (batch, D)); shape: (C, T)."""

    def __init__(self, score, batch: int, shape: tuple[int, int]):
        self.score, self.batch, self.shape = score, batch, shape
        self.ends: list[int] = []                      # per record: its last window's end in the stream
        self.queue: list[np.ndarray] = []              # windows not yet through the model
        self.window_out: list[tuple[np.ndarray, np.ndarray]] = []  # outputs of unfinished records' windows
        self.record_out: list[tuple[np.ndarray, np.ndarray]] = []  # (probs, features) of finished records
        self.through = self.finished = 0               # windows through the model; records averaged

    def add(self, windows: np.ndarray) -> None:
        """One record's windows (n, C, T)."""
        self.ends.append((self.ends[-1] if self.ends else 0) + len(windows))
        self.queue.append(windows)
        if self.ends[-1] - self.through >= self.batch:
            self._flush(final=False)

    def close(self) -> None:
        self._flush(final=True)

    def records(self, j: int, width: int, dtype: type) -> np.ndarray:
        """(records, width): the probabilities (j = 0) or features (j = 1) of every record added."""
        parts = [o[j] for o in self.record_out] or [np.zeros((0, width))]
        return np.concatenate(parts).astype(dtype).reshape(len(self.ends), width)

    def windows(self) -> np.ndarray:
        return np.diff([0, *self.ends]).astype(np.int64)

    def _flush(self, final: bool) -> None:
        from coreecg.eval.metrics import aggregate_by_record

        signal = np.concatenate(self.queue) if self.queue else np.zeros((0, *self.shape), SIGNAL_DTYPE)
        n = len(signal) if final else len(signal) // self.batch * self.batch
        if n == 0:
            return
        fill = -n % self.batch
        x = np.concatenate([signal[:n], np.zeros((fill, *self.shape), signal.dtype)]) if fill else signal[:n]
        p, f = self.score(x)
        self.window_out.append((p[:n], f[:n]))
        self.queue[:] = [signal[n:]] if n < len(signal) else []
        self.through += n
        first, start, last = self.finished, self.ends[self.finished - 1] if self.finished else 0, self.finished
        while last < len(self.ends) and self.ends[last] <= self.through:
            last += 1
        if last == first:
            return
        wp, wf = (np.concatenate([o[j] for o in self.window_out]) for j in (0, 1))
        keys = np.repeat(np.arange(first, last), np.diff([start, *self.ends[first:last]]))   # record of each window
        self.record_out.append((aggregate_by_record(keys, wp[:len(keys)])[1],
                                aggregate_by_record(keys, wf[:len(keys)])[1]))
        self.window_out[:] = [(wp[len(keys):], wf[len(keys):])]
        self.finished = last


def predict_paths(model: str | Path, inputs: Iterable[str | Path], *, embeddings: bool = False,
                  batch_size: int | None = None, device: str = "cpu", splits: Sequence[str] | None = None,
                  progress_every_s: float = 5.0) -> InferenceResult:
    """load_model + list_inputs + run_inference (InferenceError / CheckpointError for a bad model)."""
    from coreecg.hub import load_model

    loaded = load_model(model)
    items, failures = list_inputs(inputs, loaded.config, splits=splits)
    return run_inference(loaded, items, embeddings=embeddings, batch_size=batch_size, device=device,
                         failures=failures, progress_every_s=progress_every_s)


# ---------------------------------------------------------------------------- one array in memory


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, signature: tuple) -> Any:
    from coreecg.hub import load_model

    return load_model(path)


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, mtime_ns, size) of a model file, or of each file in a model folder: what a
    re-export or a new best.pt into the same path changes, so the cache never serves the old one."""
    files = [path] if path.is_file() else sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    return tuple((f.name, (st := f.stat()).st_mtime_ns, st.st_size) for f in files)


def _loaded(model: Any) -> Any:
    """A LoadedModel as given, or loaded once per path and version of its files (4 cached)."""
    if isinstance(model, (str, Path)):
        path = Path(model).expanduser().resolve()
        return _load_cached(str(path), _signature(path))
    if not all(hasattr(model, k) for k in ("model", "kind", "config", "contract")):
        raise TypeError(f"model: a path or a coreecg.hub.LoadedModel (load_model(...)), not {type(model).__name__}")
    return model


def array_record(signal: Any, fs: float, leads: Sequence[str], record_id: str = "array") -> Record:
    """A raw recording in memory -> the Record a reader would give (ValueError naming the problem).

    signal: (len(leads), samples) in millivolts, rows in `leads`' order (wfdb's p_signal.T), any
    float dtype (cast to float32, as the readers do); fs: its sampling rate in Hz; leads: a name
    per row, any order and case ("I", "aVR", "V1", ...)."""
    x = np.asarray(signal)
    leads = tuple(str(x_) for x_ in leads)
    if x.ndim != 2:
        raise ValueError(f"signal: (leads, samples) expected, got shape {x.shape}")
    if x.shape[0] != len(leads):
        hint = " (transpose it: rows are leads)" if x.shape[1] == len(leads) else ""
        raise ValueError(f"signal has {x.shape[0]} rows for {len(leads)} lead names {list(leads)}{hint}")
    return Record("array", record_id, x.astype(np.float32), float(fs), leads, None, (), record_id)


def _score_array(signal: Any, fs: float, leads: Sequence[str], model: Any, embeddings: bool,
                 device: str) -> InferenceResult:
    loaded = _loaded(model)
    result = run_inference(loaded, [array_record(signal, fs, leads)], embeddings=embeddings, device=device,
                           progress_every_s=math.inf)
    if result.failures:
        raise InferenceError(f"cannot score this recording: {result.failures[0].reason}")
    return result


def embed(signal: Any, fs: float, leads: Sequence[str], model: Any, *, device: str = "cpu") -> np.ndarray:
    """One raw recording of any length, rate and lead set -> its embedding (D,) float32.

    signal: (len(leads), samples) millivolts (`array_record`). model: a LoadedModel or any path
    load_model reads (cached). The model's own input contract is applied, exactly as
    jobs/predict.py --embeddings does for the same record (module docstring, steps 2-5):
    band-pass, resampling, 10 s windows (a shorter record: one padded window), z-score, float16,
    the crop rule, the mean over windows; leads are taken by name. InferenceError with the
    preprocessing's reason for a recording it cannot use (too short, a missing lead, ...)."""
    return _score_array(signal, fs, leads, model, True, device).embeddings[0]


def predict(signal: Any, fs: float, leads: Sequence[str], model: Any, *, device: str = "cpu") -> np.ndarray:
    """One raw recording -> a classifier's class probabilities (K,) float64, in the order of
    `load_model(model).contract["class_names"]`; as `embed` otherwise (InferenceError for an
    encoder, which has no classes)."""
    loaded = _loaded(model)
    if loaded.kind != "classifier":
        raise InferenceError(f"{loaded.source} is an encoder: it has no class probabilities (use embed)")
    return _score_array(signal, fs, leads, loaded, False, device).probs[0]


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


__all__ = ["InputRecord", "CorpusShard", "Failure", "InferenceResult", "InferenceError", "ModelInput", "input_spec",
           "source_options", "list_inputs", "list_corpus", "prepare", "shard_windows", "run_inference",
           "predict_paths", "array_record", "embed", "predict",
           "write_predictions_csv", "write_embeddings_parquet", "write_failures_csv",
           "PREDICTIONS_FILE", "EMBEDDINGS_FILE", "FAILED_FILE"]
