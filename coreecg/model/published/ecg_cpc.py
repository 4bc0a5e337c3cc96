"""ECG-CPC (Al-Masud, Lopez Alcaraz, Strodthoff, "Benchmarking ECG Foundational Models: A Reality
Check Across Clinical Tasks", ICLR 2026): its published encoder, read as data and run by coreecg's
own code.

The file: a Lightning checkpoint (`last_11597276.ckpt`, figshare 30192604) of the original
`ECGModel`: {"epoch", "global_step", "state_dict", "loops", "callbacks", "optimizer_states",
"lr_schedulers", "hparams_name", "hyper_parameters", "hparams_type"}. `hyper_parameters` pickles an
omegaconf DictConfig of the project's dataclasses, so `torch.load(weights_only=True)` fails and
coreecg reads it with its inert unpickler (coreecg.model.published.files): that entry is a
placeholder, never used (it is also reported stale). The sizes the weights do not hold (strides,
dilations, prenorm) come from the hydra config beside the file, `config_last_11597276_ckpt.yaml`
(`Payload.sidecar`), with the original dataclasses' defaults for what it leaves out.

Keys of `state_dict` (prefix `ts_encoder.`; F stem width, H = d_model, N2 = d_state / 2 stored
conjugate pairs, c kernel channels: 1 causal, 2 bidirectional, r = 1 the low-rank rank, L the
kernel length in tokens):

    encoder.layers.{i}.0.weight (F, F_in, k)        Conv1d, no bias, padding (k - 1) // 2
    encoder.layers.{i}.1.{weight,bias,running_*}    BatchNorm1d; then ReLU
    predictor.predictor.encoder.{weight,bias}       Linear F -> H, only when F != H
    predictor.predictor.s4_layers.{j}.D (1, H)      the skip term
    predictor.predictor.s4_layers.{j}.kernel.kernel.C (c, H, N2, 2)     the only kernel Parameter
        .omega, .z (L/2 + 1, 2)                     FFT nodes and their bilinear images (buffers)
        .log_dt (H,), .B (1, H, N2, 2), .P (r, H, N2, 2), .w (H, N2, 2), .Q (r, H, N2, 2)  (buffers)
    predictor.predictor.s4_layers.{j}.output_linear.0.{weight (2H, H), bias (2H, 1)}   then GLU
    predictor.predictor.norms.{j}.{weight,bias}     LayerNorm(H)
    head_ssl.proj.0.weight                          the CPC head: dropped (as are EMA copies, losses)

Complex tensors are stored as real views (..., 2) = (re, im). The computation, (B, 12, T) ->
tokens (B, T / 2, H): the stem (B, F, T') -> (B, T', F); each S4 block `s4_layers.j` with a
post-LayerNorm residual, x = LN(x + S4(x)); pooled = the mean over the tokens (the benchmark's
`CPCWrapper`: `seq.mean(dim=1)`). One S4 block (channels first, u (B, H, L)):

    k = kernel(L) (c, H, L); y = causal FFT convolution of u with k (n = 2L); y += u * D
    y = GELU(y) (exact erf); y = GLU(W y + b) over the channel axis

The kernel is S4's NPLR form (HiPPO-LegS, A = diag(w) - P Q^T), evaluated in the frequency domain
at the stored nodes z_l (the bilinear images of the L-th roots of unity omega_l), in complex64 as
the original:

    dt = exp(log_dt); w' = w dt; v[i, j] = [B; P]_i [C; Q]_j                      (2, c + 1, H, N2)
    r[i, j, l] = dt * sum_n v / (z_l - w'_n) + conj(v) / (z_l - conj(w'_n))       (the Cauchy sum)
    k_f = r00 - r01 r10 / (1 + r11)        (rank-1 Woodbury);   k_f *= 2 / (1 + omega)
    k = irfft(k_f) (length L), truncated to the input length

C is stored length-corrected (C~ = C (I - dA^L)), so that formula gives the length-L kernel
directly. An input longer than L tokens doubles the kernel length first, as the original does
(C~ <- C~ (I + dA^L), L <- 2L, nodes recomputed; dA the bilinear discretisation), here without
changing the stored weights (the original changes C in place; its kernels are the same).

The architecture is read from the weights: stem widths and kernels from the conv weights, H from
D, d_state from w, the rank from P, c (causal or not) from C, L from omega; the strides,
dilations and prenorm from the sidecar config (the published values when there is none: strides
(2, 1, 1, 1), dilations 1, post-norm).

Traps: the S4 buffers `log_dt, B, P, w, Q` may be stride-0 expanded views in a freshly built
original (load_state_dict copies them into the module's own tensors); `omega`/`z` are used as
stored (recomputing them moves the nodes by float32 rounding); `features[-1] != model_dim` adds
the predictor's input Linear; the nodes define L, not the config (the original's load replaces
the buffers by assignment). NaN: the original sets NaN to 0 (`nan_to_num`); coreecg's NaN is a
short record's padding marker, set to 0 too, and the pooled mean then covers the real steps only
(the same as the original on an input without NaN).

No ECG-CPC code is used (its repository has no licence file): this module names its parameters as
the published state dict does, so it loads with `load_state_dict` unchanged.
"""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config, ConfigError, ModelConfig, PreprocessConfig
from coreecg.config.base import STANDARD_LEADS
from coreecg.config.encoders import EncoderOptions
from coreecg.data.contract import InputContract, NanTo, Resample, Window
from coreecg.encoders.build import register_encoder
from coreecg.encoders.published.ecg_cpc import EcgCpcOptions
from coreecg.model.published.files import Payload
from coreecg.model.published.registry import PublishedFamily, register
from coreecg.model.sequence import SequenceEncoder

NAME = "ecg_cpc"
RATE = 240                                  # Hz, the model's rate (base.fs)
NATIVE = 500                                # Hz, the rate the benchmark's datasets are stored at
PREFIX = "ts_encoder."
_KERNEL = "predictor.predictor.s4_layers.{}.kernel.kernel."
_SIGNATURE = ("encoder.layers.0.0.weight", "predictor.predictor.s4_layers.0.kernel.kernel.C",
              "predictor.predictor.s4_layers.0.kernel.kernel.omega")
_STEM = re.compile(r"^encoder\.layers\.(\d+)\.0\.weight$")
_LAYER = re.compile(r"^predictor\.predictor\.s4_layers\.(\d+)\.D$")

# The benchmark's input (its run.sh "cpc", main_lite_base.py): the 12 leads in canonical order, raw
# mV, stored at 500 Hz (resampy), the first 10 s cut at that rate, then resampy to 240 Hz; no
# filter, no normalisation; NaN -> 0 at the model (after resampling, where a NaN has spread).
CONTRACT = InputContract(
    leads=STANDARD_LEADS, sampling_rate=RATE, window_samples=10 * RATE,
    steps=(Resample(NATIVE, "resampy"), Window(10 * NATIVE), Resample(RATE, "resampy"), NanTo(0.0)),
    layout="channels_first",
    notes="raw millivolts, no filtering and no normalisation; the record is brought to 500 Hz (resampy, the "
          "identity at 500 Hz) and cut into 10 s windows of 5000 samples at that rate BEFORE resampling each to "
          "240 Hz with resampy.resample(filter='kaiser_best'); NaN -> 0 last (the model's nan_to_num). The "
          "benchmark's downstream runs feed 2.5 s windows (600 samples) of the same signal.")

# The closest corpus settings (coreecg's corpus always band-passes and z-scores; the model saw neither):
# use CONTRACT for the exact input.
PREPROCESS = PreprocessConfig(sampling_rate=RATE, window_s=10.0, highpass_hz=0.05, lowpass_hz=100.0)


# ---------------------------------------------------------------------------- the S4 kernel


def _c(x: torch.Tensor) -> torch.Tensor:
    """A real view (..., 2) -> complex (...)."""
    return torch.view_as_complex(x.contiguous())


def _conj_pairs(x: torch.Tensor) -> torch.Tensor:
    """(..., N2) -> (..., 2 N2): the stored modes and their conjugates."""
    return torch.cat([x, x.conj()], dim=-1)


def fft_nodes(length: int, dtype: torch.dtype = torch.complex64) -> tuple[torch.Tensor, torch.Tensor]:
    """The FFT nodes of a length-`length` kernel: omega_l = exp(-2 pi i l / length), l = 0..length/2,
    and their bilinear images z_l = 2 (1 - omega_l) / (1 + omega_l); each (length / 2 + 1,) complex
    (computed in float64, then cast)."""
    omega = torch.from_numpy(np.exp(-2j * np.pi * np.arange(length // 2 + 1) / length))
    return omega.to(dtype), (2 * (1 - omega) / (1 + omega)).to(dtype)


def cauchy(v: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v (..., H, N2), z (L,), w (H, N2) complex -> (..., H, L): sum_n v_n / (z_l - w_n) + conj(v_n) /
    (z_l - conj(w_n)) = sum_n 2 (z_l Re v_n - Re(v_n conj w_n)) / ((z_l - w_n)(z_l - conj w_n)) (the
    original's KeOps expression), the reciprocal computed once for every v."""
    inv = 1 / ((z - w[..., None]) * (z - w.conj()[..., None]))                   # (H, N2, L)
    a = torch.einsum("...hn,hnl->...hl", v.real.to(inv.dtype), inv)
    b = torch.einsum("...hn,hnl->...hl", (v * w.conj()).real.to(inv.dtype), inv)
    return 2 * (z * a - b)


class NPLRKernel(nn.Module):
    """S4's NPLR kernel (`kernel.kernel`): length -> (c, H, length) float32 (module docstring)."""

    def __init__(self, d_model: int, d_state: int, l_max: int, channels: int = 1, rank: int = 1):
        super().__init__()
        n2 = d_state // 2
        self.l_max, self.n2, self.rank = l_max, n2, rank
        self.C = nn.Parameter(torch.randn(channels, d_model, n2, 2) * 0.5 ** 0.5)
        omega, z = fft_nodes(l_max)
        self.register_buffer("omega", torch.view_as_real(omega).clone())
        self.register_buffer("z", torch.view_as_real(z).clone())
        # HiPPO-LegS values at init in the original; here placeholders the weights always replace
        self.register_buffer("log_dt", torch.rand(d_model) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.register_buffer("B", torch.randn(1, d_model, n2, 2))
        self.register_buffer("P", torch.randn(rank, d_model, n2, 2))
        w = torch.stack([torch.full((d_model, n2), -0.5), torch.pi * torch.arange(n2).expand(d_model, n2)], -1)
        self.register_buffer("w", w.clone())
        self.register_buffer("Q", self.P.clone())

    def _doubled(self, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """C~ and the nodes for the smallest l_max * 2^k >= length: C~ <- C~ (I + dA^L) per doubling,
        dA = (I - dt/2 A)^-1 (I + dt/2 A) on the conjugate-completed state (in complex128)."""
        C = _c(self.C).to(torch.complex128)
        w = _conj_pairs(_c(self.w).to(torch.complex128))                           # (H, 2 N2)
        P = _conj_pairs(_c(self.P).to(torch.complex128))                           # (r, H, 2 N2)
        Q = _conj_pairs(_c(self.Q).to(torch.complex128))
        dt = torch.exp(self.log_dt.double())[:, None, None]
        A = torch.diag_embed(w) - torch.einsum("rhn,rhm->hnm", P, Q)               # (H, 2 N2, 2 N2)
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        dA = torch.linalg.solve(eye - dt / 2 * A, eye + dt / 2 * A)
        L = self.l_max
        while L < length:
            Cf = _conj_pairs(C)                                                    # (c, H, 2 N2)
            C = (Cf + torch.einsum("hnm,chn->chm", torch.linalg.matrix_power(dA, L), Cf))[..., : self.n2]
            L *= 2
        omega, z = fft_nodes(L)
        dtype = _c(self.C).dtype
        return C.to(dtype), omega.to(self.C.device), z.to(self.C.device), L

    def forward(self, length: int) -> torch.Tensor:
        if length > self.l_max:
            C, omega, z, _ = self._doubled(length)
        else:
            C, omega, z = _c(self.C), _c(self.omega), _c(self.z)
        dt = torch.exp(self.log_dt)
        w = _c(self.w) * dt[:, None]                                               # (H, N2)
        Bs = torch.cat([_c(self.B), _c(self.P)], dim=0)                            # (1 + r, H, N2)
        Cs = torch.cat([C, _c(self.Q)], dim=0)                                     # (c + r, H, N2)
        v = Bs[:, None] * Cs[None]                                                 # (1 + r, c + r, H, N2)
        r = cauchy(v, z, w) * dt[:, None]                                          # (1 + r, c + r, H, L/2 + 1)
        k_f = r[:-1, :-1] - r[:-1, -1:] * r[-1:, :-1] / (1 + r[-1:, -1:])          # rank-1 Woodbury
        k_f = k_f * 2 / (1 + omega)                                                # bilinear correction
        return torch.fft.irfft(k_f)[-1, ..., :length].float()                     # (c, H, length)


class _KernelWrapper(nn.Module):
    """The original's HippoSSKernel level of the key names (`kernel.kernel.*`)."""

    def __init__(self, kernel: NPLRKernel):
        super().__init__()
        self.kernel = kernel


class TransposedLinear(nn.Module):
    """A Linear on the channel axis: (B, U, L) -> (B, V, L); weight (V, U), bias (V, 1)."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / math.sqrt(d_in))
        self.bias = nn.Parameter(torch.zeros(d_out, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bul,vu->bvl", x, self.weight) + self.bias


class TiedDropout(nn.Module):
    """Dropout with one mask per (sample, channel), shared along time (the original's DropoutNd)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, H, L)."""
        if not self.training or self.p == 0:
            return x
        keep = torch.rand(*x.shape[:2], 1, device=x.device) < 1 - self.p
        return x * keep / (1 - self.p)


class S4Block(nn.Module):
    """(B, H, L) -> (B, H, L): GLU(W GELU(k * u + D u) + b), k the S4 kernel (causal, or plus a
    flipped anti-causal one when the kernel has 2 channels)."""

    def __init__(self, d_model: int, d_state: int, l_max: int, causal: bool = True, rank: int = 1,
                 dropout: float = 0.0):
        super().__init__()
        self.D = nn.Parameter(torch.randn(1, d_model))
        self.kernel = _KernelWrapper(NPLRKernel(d_model, d_state, l_max, 1 if causal else 2, rank))
        self.dropout = TiedDropout(dropout)
        self.output_linear = nn.Sequential(TransposedLinear(d_model, 2 * d_model), nn.GLU(dim=-2))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        L = u.shape[-1]
        k = self.kernel.kernel(L)                                                  # (c, H, L)
        if k.shape[0] == 2:                                                        # causal + anti-causal
            k = F.pad(k[0], (0, L)) + F.pad(k[1].flip(-1), (L, 0))
        else:
            k = k[0]
        y = torch.fft.irfft(torch.fft.rfft(u, n=2 * L) * torch.fft.rfft(k, n=2 * L), n=2 * L)[..., :L]
        y = F.gelu(y + u * self.D.transpose(0, 1))
        return self.output_linear(self.dropout(y))


class S4Model(nn.Module):
    """The predictor (`predictor.predictor`): (B, L, F) -> (B, L, H); an input Linear when F != H,
    then per block x = LN(x + drop(S4(x))) (post-norm) or x = x + drop(S4(LN(x))) (prenorm)."""

    def __init__(self, d_input: int, o: EcgCpcOptions):
        super().__init__()
        self.prenorm = o.prenorm
        self.encoder = nn.Linear(d_input, o.d_model) if d_input != o.d_model else nn.Identity()
        self.s4_layers = nn.ModuleList(S4Block(o.d_model, o.d_state, o.l_max, o.causal, o.rank, o.dropout)
                                       for _ in range(o.n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(o.d_model) for _ in range(o.n_layers))
        self.dropouts = nn.ModuleList(TiedDropout(o.dropout) for _ in range(o.n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.encoder(x).transpose(1, 2)                                        # (B, H, L)
        for layer, norm, drop in zip(self.s4_layers, self.norms, self.dropouts):
            z = norm(x.transpose(1, 2)).transpose(1, 2) if self.prenorm else x
            x = x + drop(layer(z))
            if not self.prenorm:
                x = norm(x.transpose(1, 2)).transpose(1, 2)
        return x.transpose(1, 2)


class _Stem(nn.Module):
    """The original's RNNEncoder (`encoder.layers.i`): Conv1d (no bias) + BatchNorm1d + ReLU each."""

    def __init__(self, n_leads: int, o: EcgCpcOptions):
        super().__init__()
        chans = [n_leads, *o.stem]
        self.layers = nn.Sequential(*(
            nn.Sequential(nn.Conv1d(a, b, k, s, padding=(k - 1) // 2, dilation=d, bias=False), nn.BatchNorm1d(b),
                          nn.ReLU())
            for a, b, k, s, d in zip(chans, chans[1:], o.stem_kernels, o.stem_strides, o.stem_dilations)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _Predictor(nn.Module):
    """The original's S4Predictor level of the key names (`predictor.predictor.*`)."""

    def __init__(self, d_input: int, o: EcgCpcOptions):
        super().__init__()
        self.predictor = S4Model(d_input, o)


class EcgCpcEncoder(SequenceEncoder):
    """ECG-CPC's `ts_encoder` (stem + S4 predictor) behind coreecg's Encoder interface: (B, 12, T) raw
    mV at 240 Hz -> tokens (B, L, d_model), L = T / 2 at the published strides; causal (a token sees
    its past only). The model takes the 12 standard leads in their standard order: `lead_idx` places
    fewer rows at their leads' channels, the others 0 (coreecg's SequenceEncoder)."""

    def __init__(self, n_leads: int = 12, options: EcgCpcOptions | None = None):
        super().__init__()
        o = options or EcgCpcOptions()
        o.check()
        self.options, self.n_leads, self.dim, self.patch_size = o, n_leads, o.d_model, o.stride
        self.causal = o.causal
        self.encoder = _Stem(n_leads, o)
        self.predictor = _Predictor(o.stem[-1], o)
        self.source = ""                  # the weights' file, named in errors (set by coreecg.loading)

    @classmethod
    def from_config(cls, config: Config) -> "EcgCpcEncoder":
        """From a Config: its leads (`model.n_leads`) and sizes (`encoders.ecg_cpc`, read from the weights)."""
        return cls(config.model.n_leads, config.encoders.ecg_cpc)

    @classmethod
    def _build_for(cls, config, class_names=None, multilabel=None) -> "EcgCpcEncoder":
        return cls.from_config(config)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T), no NaN -> the predictor's output (B, d_model, L)."""
        if x.shape[-1] < self.patch_size:
            raise ValueError(f"{self.source or 'ECG-CPC encoder'}: input of {x.shape[-1]} samples is shorter than "
                             f"one token ({self.patch_size} samples)")
        h = self.encoder(x).transpose(1, 2)                                        # (B, L, F)
        return self.predictor.predictor(h).transpose(1, 2)


# ---------------------------------------------------------------------------- reading the weights


def unpack(payload: Payload) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A read file -> (its "state_dict" entry, or the entries when they are a bare state dict;
    the sidecar hydra config as a plain dict, or None)."""
    entries = payload.entries
    state = entries.get("state_dict", entries)
    recorded = payload.sidecar if isinstance(payload.sidecar, dict) else None
    return (state if isinstance(state, dict) else None), recorded


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> the encoder's state (`ts_encoder.` removed): the stem (`encoder.*`) and the
    S4 predictor (`predictor.*`); the SSL head, EMA copies, losses, a downstream head dropped by
    name. None when the signature keys are absent."""
    for prefix in (PREFIX, ""):
        sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        # the stem's first conv and any S4 layer: a missing S4 parameter is then read_architecture's named error
        if _SIGNATURE[0] in sub and any(k.startswith("predictor.predictor.s4_layers.") for k in sub):
            return {k: v for k, v in sub.items() if k.split(".", 1)[0] in ("encoder", "predictor")}
    return None


def _get(state: dict[str, Any], key: str, shape: tuple[int, ...], why: str) -> torch.Tensor:
    if key not in state:
        raise ValueError(f"missing key '{key}'")
    got = tuple(state[key].shape)
    if got != shape:
        raise ValueError(f"key '{key}' has shape {got}, expected {shape} because {why}")
    return state[key]


def _need(state: dict[str, Any], key: str, ndim: int) -> torch.Tensor:
    """state[key], a tensor of `ndim` axes; ValueError naming the key otherwise."""
    if key not in state:
        raise ValueError(f"missing key '{key}'")
    if state[key].ndim != ndim:
        raise ValueError(f"key '{key}' has shape {tuple(state[key].shape)}, expected {ndim} axes")
    return state[key]


def _expected_keys(n_stem: int, n_layers: int, input_linear: bool) -> set[str]:
    """The keys of EcgCpcEncoder's state dict (tests/test_published_ecg_cpc.py checks they agree)."""
    keys = {f"encoder.layers.{i}.{k}" for i in range(n_stem)
            for k in ("0.weight", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked")}
    keys |= {"predictor.predictor.encoder.weight", "predictor.predictor.encoder.bias"} if input_linear else set()
    for j in range(n_layers):
        keys |= {f"predictor.predictor.s4_layers.{j}.{k}" for k in ("D", "output_linear.0.weight",
                                                                    "output_linear.0.bias")}
        keys |= {_KERNEL.format(j) + k for k in ("C", "omega", "z", "log_dt", "B", "P", "w", "Q")}
        keys |= {f"predictor.predictor.norms.{j}.{k}" for k in ("weight", "bias")}
    return keys


def _recorded(recorded: dict[str, Any] | None, *path: str) -> Any:
    node: Any = recorded
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def _indices(state: dict[str, Any], pattern: re.Pattern, what: str) -> int:
    found = sorted(int(m.group(1)) for m in map(pattern.match, state) if m)
    if not found or found != list(range(len(found))):
        raise ValueError(f"{what}: indices {found} are not 0..n-1")
    return len(found)


def read_architecture(state: dict[str, torch.Tensor], recorded: dict[str, Any] | None = None) -> Config:
    """The config of an ECG-CPC encoder state (after `recognise`): `model` (arch "ecg_cpc", 12 leads,
    l_max x stride input samples) and `encoders.ecg_cpc`; ValueError naming the key for a state
    whose keys or shapes do not fit together. `recorded`: the sidecar hydra config (strides,
    dilations, prenorm; its missing values take the original dataclasses' defaults)."""
    n_stem = _indices(state, _STEM, "stem convolutions 'encoder.layers.<i>.0.weight'")
    widths, kernels = [], []
    n_leads = int(state["encoder.layers.0.0.weight"].shape[1])
    c_in = n_leads
    for i in range(n_stem):
        w = state[f"encoder.layers.{i}.0.weight"]
        if w.ndim != 3 or w.shape[1] != c_in:
            raise ValueError(f"key 'encoder.layers.{i}.0.weight' has shape {tuple(w.shape)}, expected (F, {c_in}, k) "
                             f"because the stem's previous layer gives {c_in} channels")
        f = int(w.shape[0])
        for p in ("weight", "bias", "running_mean", "running_var"):
            _get(state, f"encoder.layers.{i}.1.{p}", (f,), f"stem layer {i} has {f} channels (BatchNorm1d)")
        widths.append(f)
        kernels.append(int(w.shape[2]))
        c_in = f
    enc = _recorded(recorded, "ts", "enc") or {}
    strides = enc.get("strides", [1] * 4 if recorded is not None else [2] + [1] * (n_stem - 1))
    dilations = enc.get("dilations", [1] * 4 if recorded is not None else [1] * n_stem)
    if "kss" in enc and list(enc["kss"]) != kernels:
        raise ValueError(f"the recorded kernel sizes ts.enc.kss {list(enc['kss'])} differ from the weights' {kernels}")
    if len(strides) != n_stem or len(dilations) != n_stem:
        raise ValueError(f"the recorded ts.enc.strides {list(strides)} / dilations {list(dilations)} do not give one "
                         f"value per stem layer ({n_stem})")

    n_layers = _indices(state, _LAYER, "S4 layers 'predictor.predictor.s4_layers.<j>.D'")
    k0 = _KERNEL.format(0)
    H = int(_need(state, "predictor.predictor.s4_layers.0.D", 2).shape[1])
    n2 = int(_need(state, k0 + "w", 3).shape[1])
    rank = int(_need(state, k0 + "P", 4).shape[0])
    channels = int(_need(state, k0 + "C", 4).shape[0])
    nodes = int(_need(state, k0 + "omega", 2).shape[0])
    l_max = 2 * (nodes - 1)
    if channels not in (1, 2):
        raise ValueError(f"key '{k0}C' has {channels} kernel channels, expected 1 (causal) or 2 (bidirectional)")
    if rank != 1:
        raise ValueError(f"key '{k0}P' has rank {rank}, expected 1 (HiPPO-LegS; other ranks are not implemented)")
    if widths[-1] != H:
        _get(state, "predictor.predictor.encoder.weight", (H, widths[-1]), f"the stem gives {widths[-1]} channels "
             f"and the S4 width is {H}")
        _get(state, "predictor.predictor.encoder.bias", (H,), f"the S4 width is {H}")
    for j in range(n_layers):
        kj, lj = _KERNEL.format(j), f"predictor.predictor.s4_layers.{j}."
        why = f"the S4 width is {H}, the state {2 * n2} ({n2} conjugate pairs), {channels} kernel channel(s)"
        _get(state, lj + "D", (1, H), why)
        _get(state, kj + "C", (channels, H, n2, 2), why)
        _get(state, kj + "B", (1, H, n2, 2), why)
        _get(state, kj + "P", (rank, H, n2, 2), why)
        _get(state, kj + "Q", (rank, H, n2, 2), why)
        _get(state, kj + "w", (H, n2, 2), why)
        _get(state, kj + "log_dt", (H,), why)
        _get(state, kj + "omega", (nodes, 2), f"layer 0's kernel has {nodes} FFT nodes")
        _get(state, kj + "z", (nodes, 2), f"layer 0's kernel has {nodes} FFT nodes")
        _get(state, lj + "output_linear.0.weight", (2 * H, H), f"the GLU output doubles the S4 width {H}")
        _get(state, lj + "output_linear.0.bias", (2 * H, 1), f"the GLU output doubles the S4 width {H}")
        _get(state, f"predictor.predictor.norms.{j}.weight", (H,), f"LayerNorm over the S4 width {H}")
        _get(state, f"predictor.predictor.norms.{j}.bias", (H,), f"LayerNorm over the S4 width {H}")
    pred = _recorded(recorded, "ts", "pred") or {}
    try:
        sizes = EcgCpcOptions(stem=tuple(widths), stem_kernels=tuple(kernels), stem_strides=tuple(map(int, strides)),
                              stem_dilations=tuple(map(int, dilations)), d_model=H, n_layers=n_layers,
                              d_state=2 * n2, rank=rank, l_max=l_max, causal=channels == 1,
                              prenorm=bool(pred.get("prenorm", False)), dropout=float(pred.get("dropout", 0.2)))
    except (ConfigError, TypeError, ValueError) as e:   # recorded values that do not fit: the file's fault
        raise ValueError(f"sizes that do not fit together: {e}") from e
    unexpected = sorted(set(state) - _expected_keys(n_stem, n_layers, widths[-1] != H))
    if unexpected:
        raise ValueError(f"unexpected key '{unexpected[0]}' ({len(unexpected)} in all; e.g. BatchNorm norms or a "
                         "Hurwitz kernel are not supported)")
    return Config(model=ModelConfig(arch=NAME, n_leads=n_leads, input_samples=l_max * sizes.stride),
                  encoders=EncoderOptions({NAME: sizes}))


EcgCpcEncoder.output_kind = "sequence"
register_encoder(NAME)(EcgCpcEncoder)
register(PublishedFamily(
    releases=(
        ('last_11597276.ckpt',
         'figshare article 30192604 "ECG-CPC Checkpoint" (the zip: keep config_last_11597276_ckpt.yaml beside it)'),
    ),
    name=NAME, title="ECG-CPC (Al-Masud, Lopez Alcaraz & Strodthoff, ICLR 2026)", label="ECG-CPC",
    recognise=recognise, unpack=unpack, read_architecture=read_architecture, build=EcgCpcEncoder.from_config,
    preprocess=PREPROCESS, contract=CONTRACT, module="coreecg.model.published.ecg_cpc.EcgCpcEncoder",
    licence="no licence file in AI4HealthUOL/ecg-fm-benchmarking (its S4 code adapts HazyResearch/state-spaces, "
            "Apache-2.0); the figshare weights are reported as CC BY 4.0; check both before use",
    pooling="mean over the tokens of the S4 predictor's output (CPCWrapper: seq.mean(dim=1))",
    normalisation="none: raw millivolts",
    pretraining="HEEDB (the Harvard-Emory ECG Database; the repository's config_cpc_ecg_s4_heedb.yaml: 34 "
                "HEEDB parts), CPC, 10 s windows at 240 Hz; not checked by coreecg's leakage guard",
    pretrained_on=("heedb",), commercial_use=True,
))
