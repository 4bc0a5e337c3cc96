"""The scoring engine: items in, per-record probabilities or embeddings out (`run_inference`),
through forward passes of one fixed shape (`_PassStream`) so a record scores the same whatever
records share its passes; progress on the `coreecg.inference` logger."""
from __future__ import annotations

import json
import logging
import math
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from coreecg.data.corpus import SIGNAL_DTYPE
from coreecg.devices import resolve_device
from coreecg.eval.downstream import predict
from coreecg.eval.metrics import aggregate_by_record
from coreecg.hub import load_model
from coreecg.inference.compiled import COMPILED, EAGER, MEASURED, TRIAL_PASSES, CompiledFeatures, compile_choice, \
    keep_compiled, windows_ahead
from coreecg.inference.fused import FusedLinear
from coreecg.inference.items import Failure, InferenceError, InferenceResult, Item
from coreecg.inference.listing import list_inputs
from coreecg.inference.model_input import PooledEncoder, input_spec
from coreecg.inference.precision import PrecisionError, prepare_model, resolve_precision
from coreecg.inference.precision_check import bounds_of, compare, recorded_checks, refusals, verdict
from coreecg.inference.reading import prepared_records

log = logging.getLogger("coreecg.inference")

# Windows per forward pass (x the crop rule's crops), always exactly this many (run_inference).
FORWARD_WINDOWS = 8


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
                  failures: Sequence[Failure] = (), progress_every_s: float = 5.0,
                  precision: str | None = None) -> InferenceResult:
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
    records share its passes, so Ray actors (coreecg.inference.distributed) give this process's outputs
    bit for bit (tests/test_inference_scale.py).

    precision: auto, fp32, bf16 or int8 (coreecg.inference.precision); None: the model config's
    `inference.precision`. A path the model's recorded check refused is refused (auto skips it);
    without a recorded check, the first forward pass is scored in float32 too and a path over the
    config's bounds is refused there (auto: fp32 goes on, saying why). InferenceError says why.

    The config's `inference.compile` decides whether the feature pass is compiled
    (coreecg.inference.compiled: auto compiles a CPU run of at least `compile_min_windows`
    windows, then keeps the faster of compiled and eager over its first passes); the first
    compiled pass is checked against the eager one, and a compiler failure or outputs over the
    bounds leave the run eager, saying why (`InferenceResult.compile_reason`).
    """
    spec = input_spec(loaded)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    batch = int(batch_size or FORWARD_WINDOWS)
    if batch < 1:
        raise InferenceError(f"batch size {batch} must be >= 1")
    path = inference_path(loaded, dev, precision, spec)
    compile_mode, compile_reason = compile_choice(loaded.config.inference, dev, path.precision, windows_ahead(items))
    rows = list(range(len(spec.leads)))
    threads = int(loaded.config.inference.threads)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)

    stream = _PassStream(lambda x: path.score(x, rows, batch, compile_mode), batch,
                         (len(rows), spec.preprocess.window_samples))
    t0 = time.perf_counter()
    log.info("predict: %d inputs with %s (%s, leads %s, %d crops of %d samples per %d-sample window) on %s, %s (%s), "
             "%s", len(items), loaded.source, spec.kind, ",".join(spec.leads), spec.n_crops, spec.crop,
             spec.preprocess.window_samples, dev, path.precision, path.reason, compile_reason)
    try:
        scored, failed = _stream_items(items, spec, stream, failures, progress_every_s)
    finally:
        torch.set_num_threads(before)
    seconds = time.perf_counter() - t0
    log.info("predict: %d records scored (%d windows), %d failed, in %.1f s", len(scored), stream.through,
             len(failed), seconds)
    return InferenceResult(
        record_id=[rid for _, rid, _ in scored], path=[path for _, _, path in scored],
        probs=stream.records(0, len(spec.class_names), np.float64) if spec.kind == "classifier" else None,
        embeddings=(stream.records(1, int(path.fp32.encoder.dim), np.float32)
                    if embeddings or spec.kind == "encoder" else None),
        windows=stream.windows(), class_names=spec.class_names, failures=failed,
        seconds=seconds, item=np.asarray([i for i, _, _ in scored], dtype=np.int64),
        precision=path.precision, precision_reason=path.reason, regression=spec.regression,
        compiled=path.runs_compiled(compile_mode), compile_reason=path.compile_outcome(compile_mode, compile_reason))


# Per loaded model: its prepared paths (a bf16 copy, an int8 one), each checked once in a process,
# so that coreecg.embed per record and an actor's many tasks prepare and check a path once.
_PATHS: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, _Path]]" = weakref.WeakKeyDictionary()


def inference_path(loaded: Any, device: str | torch.device, precision: str | None = None,
                   spec: Any = None) -> "_Path":
    """The precision path `run_inference` scores `loaded` with on `device` (prepared once per
    process: cached by model, request, device and its recorded checks); InferenceError for a
    path the model or the device cannot take, saying why. `.precision`, `.reason`: what it runs."""
    spec = spec or input_spec(loaded)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    requested = precision or loaded.config.inference.precision
    checks = recorded_checks(loaded.source)
    key = (requested, str(dev), spec.kind, spec.leads, tuple(sorted(bounds_of(loaded.config).items())),
           json.dumps(checks, sort_keys=True), loaded.config.inference.fuse)
    paths = _PATHS.setdefault(loaded.model, {})
    if key not in paths:
        model = loaded.model if spec.kind == "classifier" else PooledEncoder(loaded.model, spec.leads)
        paths[key] = _Path(loaded, model.to(dev).eval(), spec, dev, requested, checks)
    return paths[key]


class _Path:
    """The precision path of a model: the model prepared for it, and the first-pass check
    against float32 where the model has no recorded check of it."""

    def __init__(self, loaded: Any, model: torch.nn.Module, spec: Any, dev: torch.device, requested: str,
                 checks: dict[str, Any]):
        refused = refusals(checks)
        try:
            choice = resolve_precision(requested, dev, refused=refused)
            example = torch.zeros(1, len(spec.leads), spec.crop, device=dev)
            self.model, self.autocast = prepare_model(model, choice.precision, dev, example,
                                                      loaded.config.inference.fuse)
        except PrecisionError as e:
            raise InferenceError(f"{loaded.source}: {e}") from None
        self.fp32, self.spec, self.dev, self.requested = model, spec, dev, requested
        self.precision, self.reason = choice.precision, choice.reason
        n_fused = sum(isinstance(m, FusedLinear) for m in self.model.modules())
        n_folded = sum(isinstance(m, _BatchNorm) for m in model.modules()) - sum(
            isinstance(m, _BatchNorm) for m in self.model.modules())
        if n_folded > 0:
            self.reason += f"; {n_folded} BatchNorms folded into their convolutions"
        if n_fused:
            self.reason += f"; {n_fused} Linear / 1x1-convolution products fused with their bias and GELU (oneDNN)"
        self.bounds = bounds_of(loaded.config)
        self.source = loaded.source
        # a recorded check (jobs/export.py, on a held-out split) stands for the first-pass one
        self.unchecked = self.precision != "fp32" and self.precision not in checks
        # the compiled feature pass (coreecg.inference.compiled): (the prepared model it wraps, it)
        # once built and checked; compile_failure: why the path stays eager
        self._compiled: tuple[torch.nn.Module, CompiledFeatures] | None = None
        self.compile_failure: str | None = None
        self.compile_seconds = 0.0
        # auto's trial: seconds of the timed passes of each; `kept`: its verdict (None: still timing)
        self.trial: dict[str, list[float]] = {COMPILED: [], EAGER: []}
        self.kept: str | None = None

    def compiled_ok(self) -> bool:
        return self._compiled is not None and self._compiled[0] is self.model

    def runs_compiled(self, mode: str) -> bool:
        """Whether a run of compile mode `mode` scores (from here on) through the compiled pass."""
        return mode != EAGER and self.compiled_ok() and (mode == COMPILED or self.kept != EAGER)

    def compile_outcome(self, mode: str, why: str) -> str:
        """What a run of compile mode `mode` (`why`: compile_choice's reason) got."""
        if mode == EAGER:
            return why
        if not self.compiled_ok():
            return f"{why}; eager instead: {self.compile_failure or 'the path changed after compiling'}"
        done = f"compiled in {self.compile_seconds:.1f} s, checked against eager on the first pass"
        if mode == COMPILED:
            return f"{why}; {done}"
        if self.kept is None:
            return f"{why}; {done}; the run ended before the trial did: compiled"
        fast = {k: min(v) for k, v in self.trial.items()}
        return (f"{why}; {done}; kept {self.kept}: a pass took {fast[COMPILED]:.3f} s compiled, "
                f"{fast[EAGER]:.3f} s eager (the fastest of {TRIAL_PASSES} each)")

    def _run(self, model: torch.nn.Module, autocast: str, x: np.ndarray, rows, batch: int):
        with torch.inference_mode():           # no autograd records at all (no_grad still keeps version counters)
            return predict(model, x, rows, self.spec.crop, self.spec.n_crops, self.dev, batch, autocast)

    def score(self, x: np.ndarray, rows, batch: int, mode: str = EAGER) -> tuple[np.ndarray, np.ndarray]:
        """One forward pass of `batch` windows (B, C, T) -> (probs, features), in this path. mode
        (compile_choice's): EAGER; COMPILED, through its compiled feature pass (built and checked
        on the first such call); MEASURED, the same, then the faster of the two once timed."""
        if mode == EAGER:
            return self._score_eager(x, rows, batch)
        if self._compiled is None and self.compile_failure is None:
            return self._compile(x, rows, batch, self._score_eager(x, rows, batch))
        if not self.compiled_ok() or (mode == MEASURED and self.kept == EAGER):
            return self._score_eager(x, rows, batch)
        if mode == MEASURED and self.kept is None:
            return self._timed(x, rows, batch)
        return self._run(self._compiled[1], self.autocast, x, rows, batch)

    def _timed(self, x: np.ndarray, rows, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """A pass of auto's trial: compiled and eager in turn, timed; after TRIAL_PASSES each, the
        faster is kept for the rest of this process's runs (keep_compiled)."""
        which = COMPILED if len(self.trial[COMPILED]) <= len(self.trial[EAGER]) else EAGER
        t0 = time.perf_counter()
        out = (self._run(self._compiled[1], self.autocast, x, rows, batch) if which == COMPILED
               else self._score_eager(x, rows, batch))
        self.trial[which].append(time.perf_counter() - t0)
        if min(len(v) for v in self.trial.values()) >= TRIAL_PASSES:
            self.kept = COMPILED if keep_compiled(self.trial[COMPILED], self.trial[EAGER]) else EAGER
            log.info("predict: %s", self.compile_outcome(MEASURED, "inference.compile=auto"))
        return out

    def _compile(self, x: np.ndarray, rows, batch: int, eager: tuple[np.ndarray, np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Compile the prepared model's feature pass and check it on x against its eager outputs ->
        the compiled outputs when within the bounds (every pass of a compiled run is compiled),
        else the eager ones."""
        t0 = time.perf_counter()
        try:
            wrapper = CompiledFeatures(self.model)
            out = self._run(wrapper, self.autocast, x, rows, batch)
        except Exception as e:  # noqa: BLE001  (any compiler failure: the run goes on eagerly, saying why)
            first = str(e).splitlines()[0] if str(e) else ""
            self.compile_failure = f"the compiler failed ({type(e).__name__}: {first})"
            log.warning("predict: %s; eager instead", self.compile_failure)
            return eager
        ok, why = verdict(self._diffs(eager, out, x), self.bounds)
        if not ok:
            self.compile_failure = f"compiled outputs against eager {self.precision}: {why}"
            log.warning("predict: %s; eager instead", self.compile_failure)
            return eager
        self._compiled, self.compile_seconds = (self.model, wrapper), time.perf_counter() - t0
        log.info("predict: feature pass compiled in %.1f s, checked against eager %s on the first %d windows",
                 self.compile_seconds, self.precision, len(x))
        return out

    def _diffs(self, ref: tuple[np.ndarray, np.ndarray], out: tuple[np.ndarray, np.ndarray], x: np.ndarray) -> dict:
        """compare() of out against ref on the windows of x that hold signal (fill windows say nothing)."""
        real = np.abs(x).reshape(len(x), -1).max(axis=1) > 0
        classifier = self.spec.kind == "classifier"
        return compare(ref[0][real] if classifier else None, ref[1][real], out[0][real] if classifier else None,
                       out[1][real])

    def _score_eager(self, x: np.ndarray, rows, batch: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.unchecked:
            return self._run(self.model, self.autocast, x, rows, batch)
        self.unchecked = False
        ref = self._run(self.fp32, "fp32", x, rows, batch)
        try:
            out = self._run(self.model, self.autocast, x, rows, batch)
        except (RuntimeError, TypeError, NotImplementedError) as e:   # an op without a kernel in this dtype
            return self._refused(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", ref, 0)
        diffs = self._diffs(ref, out, x)
        ok, why = verdict(diffs, self.bounds)
        if ok:
            log.info("predict: %s checked against fp32 on the first %d windows: %s", self.precision,
                     diffs["windows"], why)
            return out
        return self._refused(why, ref, diffs["windows"])

    def _refused(self, why: str, ref: tuple[np.ndarray, np.ndarray], windows: int) -> tuple[np.ndarray, np.ndarray]:
        """The path failed its first-pass check: InferenceError when it was asked for, else fp32 from here on."""
        if self.requested != "auto":
            raise InferenceError(f"{self.source}: precision {self.precision} refused for this model on the first "
                                 f"{windows} windows: {why}")
        log.warning("predict: %s refused on the first %d windows (%s): fp32 instead", self.precision, windows, why)
        self.reason = f"auto: fp32, {self.precision} refused on the first windows ({why})"
        self.model, self.autocast, self.precision = self.fp32, "fp32", "fp32"
        return ref


def _stream_items(items: Sequence[Item], spec: Any, stream: "_PassStream", failures: Sequence[Failure],
                  progress_every_s: float) -> tuple[list[tuple[int, str, str]], list[Failure]]:
    """Every item's records read and prepared (`spec`: the model's input), their windows through
    `stream`, progress logged -> ((item index, record_id, path) per record scored, in order;
    `failures` and those of the records that could not be read)."""
    scored: list[tuple[int, str, str]] = []
    failed = list(failures)
    progress = Progress(len(items), progress_every_s)
    for i, rid, path, windows, failure in prepared_records(items, spec.preprocess):
        if failure is not None:
            failed.append(failure)
        else:
            scored.append((i, rid, path))
            stream.add(windows)
        progress.update(i, len(failed) - len(failures))        # items begun (a shard holds many records)
    stream.close()
    progress.update(len(items), len(failed) - len(failures), force=True)
    return scored, failed


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
    loaded = load_model(model)
    items, failures = list_inputs(inputs, loaded.config, splits=splits)
    return run_inference(loaded, items, embeddings=embeddings, batch_size=batch_size, device=device,
                         failures=failures, progress_every_s=progress_every_s)

