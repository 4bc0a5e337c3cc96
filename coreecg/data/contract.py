"""A published model's input contract, implemented by coreecg's own preprocessing and declared as
data: its leads and their order, its rate and window, and an ordered list of steps, each a frozen
dataclass that says its exact parameters (`describe`) and does them (`apply`).

    contract = InputContract(leads=("I", "II", ...), sampling_rate=500, window_samples=5000,
                             steps=(Notch(50, 30), Butter(0.67, 40), MedianBaseline(0.4),
                                    Normalise("zscore", "record"), Window(5000, first=True)))
    windows = contract.model_input(signal, fs, leads)     # (W, 12, 5000) float32

Steps act along the last axis of a float64 array (..., C, N) at the current rate; `Window` turns
the record (C, N) into windows (W, C, n), so the steps before it see the whole record (a filter's
edges once per record, a statistic over the record) and the steps after it each window. The
layout puts the result in the model's own form: channels first (W, C, T), time-major (W, T, C),
or flat (W, L) after `Flatten`.

Each family declares its contract in its module (coreecg.model.published.<family>); the fixtures'
model_input.npy (the original pipelines' own output) check them (tests/test_published_families.py).
Torch-free: numpy and scipy only (and resampy for the one contract that resamples with it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal, Sequence

import numpy as np
from scipy import signal as sps
from scipy.interpolate import interp1d
from scipy.ndimage import median_filter

from coreecg.config.base import STANDARD_LEADS
from coreecg.data.leads import select_leads
from coreecg.data.record import RecordError

# Lazy imports: resampy (and numba under it), inside Resample(method="resampy") only: one contract
# needs it and it costs about 1 s to import.


class ContractError(ValueError):
    """A recording the contract cannot turn into model input (too short, a lead missing)."""


@dataclass(frozen=True)
class Step:
    """One step of a contract. `apply(x, fs)`: x (..., C, N) float64 at `fs` Hz -> (x', fs')."""

    def apply(self, x: np.ndarray, fs: float) -> tuple[np.ndarray, float]:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in dataclasses.asdict(self).items())})"


@dataclass(frozen=True)
class NanTo(Step):
    """NaN samples -> `value`, or "mean": each lead's NaN -> the mean of its other samples."""

    value: float | str = 0.0

    def apply(self, x, fs):
        if not np.isnan(x).any():
            return x, fs
        if self.value == "mean":
            fill = np.nanmean(x, axis=-1, keepdims=True)
            return np.where(np.isnan(x), np.nan_to_num(fill), x), fs
        return np.nan_to_num(x, nan=float(self.value)), fs

    def describe(self):
        return ("NaN -> the mean of the lead's other samples" if self.value == "mean"
                else f"NaN -> {self.value:g}")


@dataclass(frozen=True)
class Notch(Step):
    """scipy.signal.iirnotch(f0, Q) applied forward-backward (filtfilt, scipy's default padding)."""

    f0: float = 50.0
    q: float = 30.0

    def apply(self, x, fs):
        b, a = sps.iirnotch(self.f0, self.q, fs)
        return sps.filtfilt(b, a, x, axis=-1), fs

    def describe(self):
        return f"notch {self.f0:g} Hz, Q={self.q:g} (iirnotch, filtfilt, scipy's default odd padding)"


@dataclass(frozen=True)
class Butter(Step):
    """Butterworth `btype` of `order`, zero-phase: filtfilt on (b, a) or sosfiltfilt on SOS."""

    low: float | None = 0.67
    high: float | None = 40.0
    order: int = 4
    btype: Literal["bandpass", "highpass", "lowpass"] = "bandpass"
    form: Literal["ba", "sos"] = "ba"
    padtype: str | None = "odd"
    padlen: int | None = None

    def _edges(self) -> float | list[float]:
        if self.btype == "bandpass":
            return [self.low, self.high]
        return self.low if self.btype == "highpass" else self.high

    def apply(self, x, fs):
        if self.form == "sos":
            sos = sps.butter(self.order, self._edges(), btype=self.btype, fs=fs, output="sos")
            return sps.sosfiltfilt(sos, x, axis=-1, padtype=self.padtype, padlen=self.padlen), fs
        b, a = sps.butter(self.order, self._edges(), btype=self.btype, fs=fs)
        return sps.filtfilt(b, a, x, axis=-1, padtype=self.padtype, padlen=self.padlen), fs

    def describe(self):
        edges = self._edges()
        band = f"{edges[0]:g}-{edges[1]:g} Hz" if isinstance(edges, list) else f"{edges:g} Hz"
        pad = "scipy's default padding" if self.padlen is None else f"padlen {self.padlen}"
        return (f"Butterworth {self.btype} {band}, order {self.order}, zero-phase "
                f"({'filtfilt on b, a' if self.form == 'ba' else 'sosfiltfilt'}, {self.padtype} padding, {pad})")


@dataclass(frozen=True)
class FirBandpass(Step):
    """FIR band-pass: scipy.signal.firwin(taps, [low, high], pass_zero=False, window), filtfilt."""

    low: float = 0.05
    high: float = 47.0
    taps: int = 151
    window: str = "hamming"

    def apply(self, x, fs):
        b = sps.firwin(self.taps, [2 * self.low / fs, 2 * self.high / fs], pass_zero=False, window=self.window)
        return sps.filtfilt(b, [1.0], x, axis=-1), fs

    def describe(self):
        return (f"FIR band-pass {self.low:g}-{self.high:g} Hz, {self.taps} taps ({self.window} window, firwin), "
                "zero-phase filtfilt (odd padding, 3 x taps)")


@dataclass(frozen=True)
class MedianBaseline(Step):
    """Baseline wander removed: x - medfilt(x, k), k = int(kernel_s * fs) + 1, made odd."""

    kernel_s: float = 0.4

    def kernel(self, fs: float) -> int:
        k = int(self.kernel_s * fs) + 1
        return k if k % 2 else k + 1

    def apply(self, x, fs):
        # medfilt's zero-padded median, on every lead at once (a window along the last axis only)
        size = (1,) * (x.ndim - 1) + (self.kernel(fs),)
        return x - median_filter(x, size=size, mode="constant", cval=0.0), fs

    def describe(self):
        return f"baseline: x - medfilt(x, int({self.kernel_s:g} * fs) + 1, made odd)"


@dataclass(frozen=True)
class Resample(Step):
    """To `rate` Hz. fft: scipy.signal.resample onto int(N * rate / fs) samples (`length` floor) or
    round(...); poly: resample_poly with exact rational factors; linear: interp1d(kind="linear")
    onto int(N * rate / fs) samples spread over the same span; resampy: resampy.resample
    (filter="kaiser_best")."""

    rate: float = 500.0
    method: Literal["fft", "poly", "linear", "resampy"] = "fft"
    length: Literal["floor", "round"] = "floor"

    def samples(self, n: int, fs: float) -> int:
        exact = n * self.rate / fs
        return int(round(exact)) if self.length == "round" else int(exact)

    def apply(self, x, fs):
        if fs == self.rate and self.method in ("poly", "linear"):
            return x, fs
        n = x.shape[-1]
        if self.method == "fft":
            return sps.resample(x, self.samples(n, fs), axis=-1), self.rate
        if self.method == "poly":
            ratio = Fraction(self.rate) / Fraction(fs)
            return sps.resample_poly(x, ratio.numerator, ratio.denominator, axis=-1), self.rate
        if self.method == "linear":
            m = self.samples(n, fs)
            return interp1d(np.linspace(0, m - 1, n), x, kind="linear", axis=-1)(np.arange(m)), self.rate
        import resampy

        return resampy.resample(x, fs, self.rate, axis=-1, filter="kaiser_best"), self.rate

    def describe(self):
        how = {"fft": "scipy.signal.resample (FFT)", "poly": "scipy.signal.resample_poly (exact factors)",
               "linear": "linear interpolation (interp1d)", "resampy": "resampy.resample, kaiser_best"}[self.method]
        return f"resample to {self.rate:g} Hz: {how}, {self.length}(N x {self.rate:g} / fs) samples"


@dataclass(frozen=True)
class Normalise(Step):
    """zscore: (x - mean) / (std + eps) (eps_mode add) or a flat one -> 0 (eps_mode flat), ddof 0;
    minmax: lo + (hi - lo) * (x - min) / (max - min + eps). axis lead: per lead; record: one
    statistic over leads and time together."""

    method: Literal["zscore", "minmax"] = "zscore"
    axis: Literal["lead", "record"] = "lead"
    eps: float = 1e-8
    eps_mode: Literal["add", "flat"] = "add"
    range: tuple[float, float] = (0.0, 1.0)

    def apply(self, x, fs):
        axes = (-2, -1) if self.axis == "record" else (-1,)
        if self.method == "minmax":
            lo, hi = self.range
            mn, mx = x.min(axis=axes, keepdims=True), x.max(axis=axes, keepdims=True)
            return lo + (hi - lo) * (x - mn) / (mx - mn + self.eps), fs
        mean = x.mean(axis=axes, keepdims=True)
        std = x.std(axis=axes, keepdims=True)
        if self.eps_mode == "flat":
            flat = std < self.eps
            return np.where(flat, 0.0, (x - mean) / np.where(flat, 1.0, std)), fs
        return (x - mean) / (std + self.eps), fs

    def describe(self):
        over = "per lead over time" if self.axis == "lead" else "over leads and time together"
        if self.method == "minmax":
            return f"min-max to [{self.range[0]:g}, {self.range[1]:g}] {over}, + {self.eps:g} in the denominator"
        tail = f"+ {self.eps:g} on the std" if self.eps_mode == "add" else f"std < {self.eps:g} -> zeros"
        return f"z-score {over} (population std), {tail}"


@dataclass(frozen=True)
class ConstantLeads(Step):
    """A lead whose std is exactly 0 -> zeros (ECG-FM's HandleConstantLeads("zero"))."""

    def apply(self, x, fs):
        return np.where(x.std(axis=-1, keepdims=True) == 0, 0.0, x), fs

    def describe(self):
        return "a lead with std exactly 0 -> zeros"


@dataclass(frozen=True)
class Window(Step):
    """(C, N) -> (W, C, samples): consecutive windows every `hop` samples (default: `samples`), the
    remainder dropped; pad="zero": a record shorter than one window gives one window, zero-padded at
    its end (None: ContractError); first: only the first window."""

    samples: int = 2500
    hop: int | None = None
    pad: Literal["zero"] | None = None
    first: bool = False

    def apply(self, x, fs):
        if x.ndim != 2:
            raise ContractError("Window takes one record (C, N)")
        n, hop = x.shape[-1], self.hop or self.samples
        if n < self.samples:
            if self.pad != "zero":
                raise ContractError(f"{n} samples at {fs:g} Hz, shorter than one window of {self.samples}")
            out = np.zeros((1, x.shape[0], self.samples))
            out[0, :, :n] = x
            return out, fs
        count = 1 if self.first else 1 + (n - self.samples) // hop
        starts = np.arange(count) * hop
        return np.stack([x[:, s: s + self.samples] for s in starts]), fs

    def describe(self):
        hop = self.hop or self.samples
        which = "the first window" if self.first else (
            "non-overlapping windows" if hop == self.samples else f"windows every {hop} samples")
        pad = ", a shorter record zero-padded to one window" if self.pad == "zero" else ""
        return f"{which} of {self.samples} samples, the remainder dropped{pad}"


@dataclass(frozen=True)
class Crop(Step):
    """x[..., start:start + samples] (samples None: to the end), then the tail cut to a multiple
    of `multiple`."""

    samples: int | None = None
    start: int = 0
    multiple: int = 1

    def apply(self, x, fs):
        end = None if self.samples is None else self.start + self.samples
        x = x[..., self.start: end]
        keep = x.shape[-1] - x.shape[-1] % self.multiple
        if keep == 0:
            raise ContractError(f"nothing left after cropping to a multiple of {self.multiple} samples")
        return x[..., :keep], fs

    def describe(self):
        span = "to the end" if self.samples is None else f"{self.samples} samples"
        cut = f", the tail cut to a multiple of {self.multiple}" if self.multiple > 1 else ""
        return f"crop from sample {self.start}, {span}{cut}"


@dataclass(frozen=True)
class Flatten(Step):
    """(..., C, N) -> (..., 1, C * N), lead-major: [lead 0's N samples, lead 1's, ...]."""

    def apply(self, x, fs):
        return x.reshape(*x.shape[:-2], 1, x.shape[-2] * x.shape[-1]), fs

    def describe(self):
        return "flatten lead-major: the leads one after another into one sequence"


@dataclass(frozen=True)
class Decimate(Step):
    """scipy.signal.decimate(x, q) with its defaults (IIR Chebyshev I order 8, zero-phase)."""

    q: int = 5

    def apply(self, x, fs):
        return sps.decimate(x, self.q, axis=-1), fs / self.q

    def describe(self):
        return f"scipy.signal.decimate by {self.q} (IIR Chebyshev I, order 8, zero-phase)"


Layout = Literal["channels_first", "time_major", "flat"]


@dataclass(frozen=True)
class InputContract:
    """What a published model is fed: its rows (`leads`, names in the model's row order, a
    permutation or subset of the standard leads), its rate and window (at that rate, before any
    `Flatten`), the ordered `steps`, and the layout of one window."""

    leads: tuple[str, ...]
    sampling_rate: float
    window_samples: int
    steps: tuple[Step, ...]
    layout: Layout = "channels_first"
    notes: str = ""
    units: str = "mV"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [x for x in self.leads if x not in STANDARD_LEADS]
        if unknown or len(set(self.leads)) != len(self.leads):
            raise ValueError(f"contract leads {self.leads}: distinct standard lead names needed ({unknown})")
        if sum(isinstance(s, Window) for s in self.steps) > 1:
            raise ValueError("a contract has at most one Window step")

    def model_input(self, signal: np.ndarray, fs: float, leads: Sequence[str], path: str = "<array>") -> np.ndarray:
        """signal (C, N) in mV at `fs` Hz, rows named by `leads` -> the model's windows, float32:
        (W, C', T) channels first, (W, T, C') time-major, (W, L) flat. ContractError naming
        `path` for a recording it cannot take (a lead missing, too short)."""
        x = np.asarray(signal, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != len(leads):
            raise ContractError(f"{path}: signal of shape {x.shape} for {len(leads)} lead names")
        try:
            x, _ = select_leads(x, tuple(leads), self.leads, ("VX", "VY", "VZ"), path)  # other standard leads: unused
        except RecordError as e:
            raise ContractError(f"{path}: {e}") from e
        rate = float(fs)
        windowed = False
        try:
            for step in self.steps:
                x, rate = step.apply(x, rate)
                windowed = windowed or isinstance(step, Window)
        except ContractError as e:
            raise ContractError(f"{path}: {e}") from e
        if not windowed:
            x = x[None]
        if self.layout == "time_major":
            x = np.swapaxes(x, -1, -2)
        elif self.layout == "flat":
            x = x.reshape(x.shape[0], -1)
        return np.ascontiguousarray(x, dtype=np.float32)

    def windows(self, signal: np.ndarray, fs: float, leads: Sequence[str], path: str = "<array>") -> np.ndarray:
        """The same windows in coreecg's stored form, (W, C, T') channels first (`canonical`): what
        a corpus built under this contract holds (data.preprocess.contract)."""
        return self.canonical(self.model_input(signal, fs, leads, path))

    def canonical(self, x):
        """Model layout -> (W, C, T'): time-major transposed; flat split into the C leads' equal
        parts (lead-major, so part c is lead c's samples: HuBERT-ECG's decimated 6000 -> 12 x 500).
        numpy arrays and torch tensors alike."""
        if self.layout == "time_major":
            return x.swapaxes(-1, -2)
        if self.layout == "flat":
            return x.reshape(x.shape[0], len(self.leads), -1)
        return x

    def to_model(self, x):
        """(B, C, T') stored form -> the model's layout (the inverse of `canonical`)."""
        if self.layout == "time_major":
            return x.swapaxes(-1, -2)
        if self.layout == "flat":
            return x.reshape(x.shape[0], -1)
        return x

    def stored_samples(self) -> int:
        """T' of the stored form: samples per lead of one window after every step."""
        shape = self.input_shape()
        return shape[0] // len(self.leads) if self.layout == "flat" else shape[-1] if \
            self.layout == "channels_first" else shape[0]

    def stored_rate(self) -> float:
        """The rate of the stored form (a Decimate divides it)."""
        rate = float(self.sampling_rate)
        for s in self.steps:
            if isinstance(s, Decimate):
                rate /= s.q
        return rate

    def input_shape(self) -> tuple[int, ...]:
        """One window's shape (no batch axis)."""
        c, t = len(self.leads), self.window_samples
        flat = any(isinstance(s, Flatten) for s in self.steps)
        q = 1
        for s in self.steps:
            if isinstance(s, Decimate):
                q *= s.q
        if self.layout == "flat" or flat:
            return (-(-c * t // q),)
        return (t, c) if self.layout == "time_major" else (c, t)

    def describe(self) -> dict[str, Any]:
        """The contract as data, for model cards, exports and docs."""
        return {"leads": list(self.leads), "sampling_rate": self.sampling_rate,
                "window_samples": self.window_samples, "window_seconds": self.window_samples / self.sampling_rate,
                "layout": self.layout, "shape": [None, *self.input_shape()], "units": self.units,
                "steps": [s.describe() for s in self.steps], "notes": self.notes}
