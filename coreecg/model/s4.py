"""A diagonal state-space encoder (S4D: Gu, Gupta, Goel, Ré, "On the Parameterization and
Initialization of Diagonal State Space Models", NeurIPS 2022) behind a convolutional stem, as
ECG-CPC (Al-Masud & Strodthoff 2026) uses S4 on ECGs; plain PyTorch, CPU and GPU.

One S4D channel h (of d_model) is the linear recurrence, discretised by zero-order hold with its
learned step dt_h:

    x_k = exp(dt A) x_{k-1} + (exp(dt A) - 1) / A * u_k        (x: d_state/2 complex modes)
    y_k = 2 Re(C x_k) + D u_k

with A_n = -exp(log_a_n) + i pi n (S4D-Lin), unrolled into one convolution kernel
K_l = 2 Re(sum_n C_n (exp(dt A_n) - 1) / A_n exp(dt A_n l)) applied by FFT (no Python loop over
time or channels; tests/test_encoders.py checks it against the recurrence). The kernel depends on
the weights and L only: without autograd (inference, validation) its spectrum is computed once per
length and weights (`S4DKernel.spectrum`): 1.3-1.7x an inference pass (docs/performance.md).
A block: pre-norm, S4D (+ D skip), GELU, a GLU output projection, residual. Causal unless `bidirectional`.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.encoders.build import register_encoder
from coreecg.model.padding import fill
from coreecg.model.sequence import SequenceEncoder


# Spectra kept per kernel (one per input length and weights; lengths past this clear the cache).
SPECTRA_KEPT = 8
# Samples per chunk of a CPU pass without autograd (S4Encoder.features; 0: one pass of the whole
# batch). Measured at 1-8 rows: 2-4 the fastest, within noise of each other.
CPU_ROWS = 4


class S4DKernel(nn.Module):
    """The convolution kernel of d_model S4D channels: L -> (d_model, L); `spectrum(L)` its
    rfft over 2L points (d_model, L + 1), cached when autograd is off."""

    def __init__(self, d_model: int, d_state: int = 64, dt_min: float = 0.001, dt_max: float = 0.1):
        super().__init__()
        n = d_state // 2
        self.log_dt = nn.Parameter(torch.rand(d_model) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.C = nn.Parameter(torch.view_as_real(torch.randn(d_model, n, dtype=torch.cfloat) * 0.5 ** 0.5))
        self.log_a = nn.Parameter(torch.full((d_model, n), math.log(0.5)))
        self.a_imag = nn.Parameter(math.pi * torch.arange(n, dtype=torch.float).expand(d_model, n).clone())
        self._spectra: dict[tuple, torch.Tensor] = {}

    def _apply(self, fn, *args, **kwargs):
        # .to() / .cuda() / .bfloat16() may move a weight without bumping its version counter
        self._spectra = {}
        return super()._apply(fn, *args, **kwargs)

    def spectrum(self, L: int) -> torch.Tensor:
        """rfft(K, 2L): (d_model, L + 1) complex64. Without autograd it is kept, keyed by L and
        every weight's storage and version counter, so an optimiser step or load_state_dict
        (in place: a new version) recomputes it; under autograd or compilation it is computed."""
        compiling = getattr(torch.compiler, "is_compiling", lambda: False)()
        if torch.is_grad_enabled() or compiling:
            return torch.fft.rfft(self(L), 2 * L)
        key = (L, torch.is_inference_mode_enabled(),
               *((p.device, p.dtype, p.data_ptr(), p._version) for p in self.parameters()))
        spectrum = self._spectra.get(key)
        if spectrum is None:
            if len(self._spectra) >= SPECTRA_KEPT:
                self._spectra = {}
            spectrum = self._spectra[key] = torch.fft.rfft(self(L), 2 * L)
        return spectrum

    def modes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(A (H, n), dt (H,), C (H, n)) as complex64 / float32 (for reading; the kernel is computed
        in real arithmetic, which ONNX can export)."""
        A = torch.complex(-torch.exp(self.log_a.float()), self.a_imag.float())
        return A, torch.exp(self.log_dt.float()), torch.view_as_complex(self.C.float().contiguous())

    def forward(self, L: int) -> torch.Tensor:
        dt = torch.exp(self.log_dt.float())[:, None]                             # (H, 1)
        a_re, a_im = -torch.exp(self.log_a.float()), self.a_imag.float()         # A = a_re + i a_im
        re, im = a_re * dt, a_im * dt                                            # dt A
        # coef = C (exp(dt A) - 1) / A, written out in real and imaginary parts
        e_re, e_im = torch.exp(re) * torch.cos(im) - 1.0, torch.exp(re) * torch.sin(im)
        norm = a_re ** 2 + a_im ** 2
        q_re, q_im = (e_re * a_re + e_im * a_im) / norm, (e_im * a_re - e_re * a_im) / norm
        c_re, c_im = self.C[..., 0].float(), self.C[..., 1].float()
        k_re, k_im = c_re * q_re - c_im * q_im, c_re * q_im + c_im * q_re          # (H, n)
        steps = torch.arange(L, device=dt.device, dtype=torch.float32)
        decay = torch.exp(re[..., None] * steps)                                 # (H, n, L)
        phase = im[..., None] * steps
        # K_l = 2 Re(sum_n coef_n exp(dt A_n l))
        return 2.0 * (decay * (k_re[..., None] * torch.cos(phase) - k_im[..., None] * torch.sin(phase))).sum(1)


@contextlib.contextmanager
def unchunked(module: nn.Module):
    """Every S4Encoder in `module` runs a batch in one pass inside (hooks that expect one call of
    each block per forward: coreecg.model.layer_features)."""
    encoders = [m for m in module.modules() if isinstance(m, S4Encoder)]
    kept = [m.cpu_rows for m in encoders]
    for m in encoders:
        m.cpu_rows = 0
    try:
        yield module
    finally:
        for m, rows in zip(encoders, kept):
            m.cpu_rows = rows


def fft_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal convolution of u (B, H, L) with one kernel per channel k (H, L), by FFT (float32);
    under an export (ONNX has no complex tensors) the same sum as a grouped Conv1d (`direct_conv`)."""
    if _exporting():
        return direct_conv(u, k)
    L = u.shape[-1]
    n = 2 * L
    return spectral_conv(u, torch.fft.rfft(k.float(), n))


def spectral_conv(u: torch.Tensor, spectrum: torch.Tensor) -> torch.Tensor:
    """fft_conv of u (B, H, L) with a kernel given by its spectrum rfft(k, 2L) (H, L + 1), float32."""
    L = u.shape[-1]
    return torch.fft.irfft(torch.fft.rfft(u.float(), 2 * L) * spectrum, 2 * L)[..., :L]


def direct_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """y[b, h, t] = sum_{j <= t} k[h, j] u[b, h, t - j]: O(L^2), real ops only."""
    H, L = k.shape
    return F.conv1d(F.pad(u.float(), (L - 1, 0)), k.float().flip(-1)[:, None, :], groups=H)


def _exporting() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(getattr(compiler, "is_exporting", lambda: False)() or torch.onnx.is_in_onnx_export())


class S4DBlock(nn.Module):
    """(B, L, H) -> (B, L, H): x + GLU(W GELU(S4D(norm(x)) + D norm(x)))."""

    def __init__(self, d_model: int, d_state: int, bidirectional: bool, dt_min: float, dt_max: float,
                 dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.kernel = S4DKernel(d_model, d_state, dt_min, dt_max)
        self.backward_kernel = S4DKernel(d_model, d_state, dt_min, dt_max) if bidirectional else None
        self.D = nn.Parameter(torch.randn(d_model))
        self.out = nn.Linear(d_model, 2 * d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.norm(x).transpose(1, 2)                                          # (B, H, L)
        y = self._conv(z, self.kernel)
        if self.backward_kernel is not None:
            y = y + self._conv(z.flip(-1), self.backward_kernel).flip(-1)
        y = F.gelu(y.to(z.dtype) + z * self.D[:, None].to(z.dtype))
        y = F.glu(self.out(self.drop(y.transpose(1, 2))), dim=-1)
        return x + self.drop(y)

    @staticmethod
    def _conv(z: torch.Tensor, kernel: S4DKernel) -> torch.Tensor:
        """z (B, H, L) convolved causally with kernel's K (H, L) -> (B, H, L) float32."""
        L = z.shape[-1]
        if _exporting():
            return direct_conv(z, kernel(L))
        return spectral_conv(z, kernel.spectrum(L))


class S4Encoder(SequenceEncoder):
    """Stem (Conv1d of kernel = stride, GELU, per entry of `stem`), a 1x1 projection to d_model,
    `n_layers` S4D blocks, a final LayerNorm: (B, C, T) -> Encoded over T // patch_size steps."""

    def __init__(self, n_leads: int = 12, d_model: int = 512, n_layers: int = 4, d_state: int = 64,
                 stem: tuple[int, ...] = (512, 512, 512, 512), stem_strides: tuple[int, ...] = (5, 1, 1, 1),
                 bidirectional: bool = False, dt_min: float = 0.001, dt_max: float = 0.1, dropout: float = 0.1):
        super().__init__()
        self.n_leads, self.dim, self.causal = n_leads, d_model, not bidirectional
        chans = [n_leads, *stem]
        convs: list[nn.Module] = []
        for a, b, s in zip(chans, chans[1:], stem_strides):
            convs += [nn.Conv1d(a, b, s, s), nn.GELU()]
        self.stem = nn.Sequential(*convs, nn.Conv1d(chans[-1], d_model, 1))
        self.patch_size = math.prod(stem_strides)
        self.blocks = nn.ModuleList(S4DBlock(d_model, d_state, bidirectional, dt_min, dt_max, dropout)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.cpu_rows = CPU_ROWS

    @classmethod
    def from_config(cls, config) -> "S4Encoder":
        o = config.encoders.s4
        return cls(config.model.n_leads, o.d_model, o.n_layers, o.d_state, tuple(o.stem), tuple(o.stem_strides),
                   o.bidirectional, o.dt_min, o.dt_max, o.dropout)

    @classmethod
    def _build_for(cls, config, class_names=None, multilabel=None) -> "S4Encoder":
        return cls.from_config(config)

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[-1] // self.patch_size * self.patch_size       # whole steps only
        return self.stem(x[..., :T]).transpose(1, 2)                # (B, L, d_model)

    def local_features(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, T) -> the stem's frames (B, L, d_model): each sees its own `patch_size` samples
        only (CPC's targets, predicted from the causal output: coreecg.methods.cpc)."""
        return self._stem(self.placed(fill(x), lead_idx))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T) -> (B, d_model, L). On the CPU without autograd (inference, validation)
        in chunks of `cpu_rows` samples: each chunk's FFT buffers, (rows, d_model, 2L) complex, stay
        in the processor's cache instead of streaming from memory; measured on a Xeon with AMX,
        paper size, 24 samples: 1.75x float32's and 1.28x bfloat16's samples/s at 4 rows
        (docs/performance.md). A sample's values never depend on the others' (only on its chunk's
        row count, fixed for a fixed batch)."""
        rows = self.cpu_rows
        # the batch size is looked at last: under an export it is symbolic, and a test on it would fix it
        if (rows and x.device.type == "cpu" and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
                and not torch.jit.is_tracing() and not _exporting() and len(x) > rows):
            return torch.cat([self._features(chunk) for chunk in x.split(rows)])
        return self._features(x)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        h = self._stem(x)
        for block in self.blocks:
            h = block(h)
        return self.norm(h).transpose(1, 2)


register_encoder("s4")(S4Encoder)
