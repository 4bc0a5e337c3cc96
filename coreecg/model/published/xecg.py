"""xECG (BenchECG and xECG, arXiv 2509.10151): its published encoder, read as data and run by
coreecg's own code.

xECG publishes a Hugging Face folder (PyTorchModelHubMixin), `riccardolunelli/xECG_base_model_v1`:

    config.json          flat: embedding_size, num_heads, patch_size, proj_factor, xlstm_config
                         (["s", "s", "m", ...]), activation_fn, cls_type, dropout, sampling_freq, ...
    model.safetensors    the `xECG` module's state dict

Keys of the file (E width, NH heads, DH = E / NH, P patch size, b a block index):

    patch_embedding.conv.weight (E, 12, P)          Conv1d, kernel = stride = P, no bias
    mask_token (E,)                                 the SimDINOv2 mask embedding (pretraining only: dropped)
    core.model.blocks.b.xlstm_norm.weight (E,)      pre-norm of every block
    sLSTM block:  .xlstm.conv1d.conv.{weight (E, 1, 4), bias}, .xlstm.{fgate,igate,zgate,ogate}.weight
                  (NH, DH, DH), .xlstm.slstm_cell._recurrent_kernel_, .xlstm.slstm_cell._bias_ (4E,),
                  .xlstm.group_norm.weight, .ffn_norm.weight, .ffn.proj_up.weight (2F, E), .ffn.proj_down (E, F)
    mLSTM block:  .xlstm.proj_up.weight (2I, E), .xlstm.conv1d.conv.{weight (I, 1, 4), bias},
                  .xlstm.{q,k,v}_proj.weight (I/4, 4, 4), .xlstm.mlstm_cell.{igate,fgate}.{weight (NH, 3I),
                  bias}, .xlstm.mlstm_cell.outnorm.weight, .xlstm.learnable_skip (I,), .xlstm.proj_down (E, I)
    core.model.post_blocks_norm.weight (E,)         only with use_final_layer_norm (not in the release)

`recognise` removes the `core.model.` prefix (and, as xECG's own `load_checkpoint` maps a training
checkpoint, a leading `model.` and `xlstm.model` -> `core.model`) and keeps these keys by name.

THE TRAP: the sLSTM cells were saved from xlstm's CUDA backend. Its recurrent kernel is stored
(NH, DH_in, 4 * DH_out), its bias flat (4E,) in (head, gate, dim) order; xlstm's vanilla backend
holds (NH, 4 * DH_out, DH_in) and (gate, head, dim). The bias has the same shape in both, so a
loader that only transposes the kernel loads without an error and computes garbage. Here the cell
holds its own names and layout, `slstm_cell.recurrent_kernel` (NH, DH_in, 4, DH_out) and
`slstm_cell.bias` (4, NH, DH) (gates i, f, z, o); `recognise` converts either backend's pair into
them (told apart by the kernel's shape; the bias always follows its kernel's layout), so
`load_state_dict` is strict on this module's names and a file key never lands unconverted.

The computation (xlstm 2.0.6's modules, written here from their definitions):

    tokens = Conv1d(x (B, T, 12) -> (B, 12, T)) -> (B, L = T / P, E)
    for block b: if b > 0 reverse the tokens in time; x = x + layer(LN(x)); sLSTM: x = x + FFN(LN(x))
    no flip back, no final norm (an odd block count ends in time order); pooled: the mean (xECG's
    cls_type "avg", or "max") over the patches, a patch whose FIRST sample is exactly 0 on all 12
    leads excluded as padding.

    LayerNorm: no bias, scale 1 + weight, eps 1e-5; the per-head norms (group_norm, outnorm):
    group_norm with NH groups, scale 1 + weight.
    sLSTM layer: c = SiLU(causal depthwise conv(x)); gate pre-activations i = fgate(c), f = igate(c),
    z = zgate(x), o = ogate(x) (xlstm feeds the cell fgate's output as its FIRST gate), each a
    block-diagonal (headwise) map; the cell's stabilised exponential-gating recurrence with the
    recurrent kernel per head; the per-head norm.
    FFN: proj_up (E -> 2F), gelu(first half) * second half, proj_down (F -> E).
    mLSTM layer: proj_up E -> (x_m, z) of I each; c = SiLU(conv(x_m)); q, k from c, v from x_m
    (headwise 4 x 4 maps); input and forget gates Linear(3I -> NH) on cat(q, k, v); the parallel
    stabilised mLSTM (xlstm's `parallel_stabilized_simple`: a gated, normalised linear attention,
    not a softmax, so it is written out rather than run by SDPA); outnorm; + learnable_skip * c;
    * SiLU(z); proj_down.

The architecture is read from the weights: E, the lead count and P from the patch convolution;
the block kinds from the block keys; NH from an sLSTM gate (NH, DH, DH) or an mLSTM gate (NH, 3I);
I, F, the q/k/v block and the conv kernel from their weights; the final norm from its key. The
FFN activation and the pooling are not in the weights: config.json's `activation_fn` and
`cls_type` give them (defaults gelu, avg, as released).

No xECG or xlstm code is used: the parameters are named as the published state dict names them
(bar the converted sLSTM pair), so the file loads with `load_state_dict` unchanged otherwise.
Numerics: float32 throughout, as xlstm's vanilla backend (the CUDA kernel runs the sLSTM
recurrence in bfloat16 by default, so the authors' own GPU features differ at that precision).
"""
from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config, ModelConfig, PreprocessConfig
from coreecg.config.encoders import EncoderOptions
from coreecg.data.contract import Crop, InputContract, Resample, Window
from coreecg.encoders.build import register_encoder
from coreecg.encoders.published.xecg import XEcgOptions, rounded_up
from coreecg.model.encoder import Encoded, default_lead_idx
from coreecg.model.padding import fill
from coreecg.model.published.files import Payload
from coreecg.model.published.registry import PublishedFamily, register

NAME = "xecg"
LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
RATE, MAX_SAMPLES, PATCH = 100, 1200, 25
CORPUS_SAMPLES = 1000           # 10 s at 100 Hz: a corpus window (the model takes any multiple of 25)
EPS = 1e-5                      # xlstm's LayerNorm / group_norm eps
MLSTM_EPS = 1e-6                # parallel_stabilized_simple's normaliser eps
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_SIGNATURE = ("patch_embedding.conv.weight", "blocks.0.xlstm_norm.weight")
_CELL_FILE = ("xlstm.slstm_cell._recurrent_kernel_", "xlstm.slstm_cell._bias_")    # xlstm's names (either backend)

# bench-xecg's input (pretraining_dataset.py, generic_utils.py, pretrain_run_config.yaml): leads
# mapped by name, FFT-resampled to 100 Hz onto round(N * 100 / fs) samples (neurokit2's
# signal_resample "FFT"), the first 12 s kept (CropFixedLen), the tail cut to whole patches; raw mV.
WINDOW = 1000            # 10 s at 100 Hz: the window coreecg stores and fine-tunes on (docs/published_encoders.md)
CONTRACT = InputContract(
    leads=LEADS, sampling_rate=RATE, window_samples=WINDOW,
    steps=(Resample(RATE, method="fft", length="round"), Crop(samples=MAX_SAMPLES, multiple=PATCH),
           Window(WINDOW, first=True)),
    layout="time_major",
    notes="raw mV: no filter, no normalisation, no clipping; the original keeps at most 12 s (1200 samples) from "
          "a record's start, cut to a multiple of 25; coreecg then takes its first 10 s (1000 samples: the fixed "
          "window a corpus stores; a 10 s record is exactly the original's input, a longer one loses its tail, a "
          "shorter one is refused rather than padded, since padding changes the real tokens through the reversed "
          "blocks); a 25-sample patch whose first sample is 0 on all 12 leads counts as padding")


# ---------------------------------------------------------------------------- xlstm's components


class _LayerNorm(nn.Module):
    """xlstm's LayerNorm: no bias, scale 1 + weight (the weight is stored as an offset from 1)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), 1.0 + self.weight, None, EPS)


class _HeadNorm(_LayerNorm):
    """xlstm's MultiHeadLayerNorm: each head normalised on its own (group_norm, NH groups)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, S, NH, DH) -> (B, S, NH * DH)."""
        B, S, NH, DH = x.shape
        return F.group_norm(x.reshape(B * S, NH * DH), NH, 1.0 + self.weight, None, EPS).view(B, S, NH * DH)


class _Headwise(nn.Module):
    """xlstm's LinearHeadwiseExpand without bias: a block-diagonal map, weight (heads, out, in)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(heads, dim // heads, dim // heads) * (2 / 5 / (dim // heads)) ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., heads * in) -> (..., heads * out)."""
        h = x.view(*x.shape[:-1], self.weight.shape[0], -1)
        return torch.einsum("...hd,hod->...ho", h, self.weight).reshape(*x.shape[:-1], -1)


class _CausalConv(nn.Module):
    """Depthwise Conv1d with bias, padded on the left only (output t sees inputs <= t)."""

    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, kernel, padding=kernel - 1, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, S, D) -> (B, S, D)."""
        return self.conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


class _GatedFFN(nn.Module):
    """proj_up E -> 2F, act(first half) * second half, proj_down F -> E; no biases."""

    def __init__(self, dim: int, hidden: int, activation: str):
        super().__init__()
        self.proj_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.proj_down = nn.Linear(hidden, dim, bias=False)
        self.act = _ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.proj_up(x).chunk(2, dim=-1)
        return self.proj_down(self.act(gate) * up)


_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "relu^2": lambda x: torch.square(F.relu(x)),
                "sigmoid": torch.sigmoid, "swish": F.silu, "selu": F.selu}


# ---------------------------------------------------------------------------- sLSTM


class _SLSTMCell(nn.Module):
    """The sLSTM recurrence (exponential gating, log-space stabiliser m), per head.

    recurrent_kernel (NH, DH_in, 4, DH_out): h_{t-1} of a head -> its 4 gates; bias (4, NH, DH).
    Gates in order i, f, z, o. The file's CUDA (or vanilla) layout is converted by `recognise`.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.recurrent_kernel = nn.Parameter(torch.zeros(heads, self.head_dim, 4, self.head_dim))
        self.bias = nn.Parameter(torch.zeros(4, heads, self.head_dim))

    def forward(self, wx: torch.Tensor) -> torch.Tensor:
        """wx: (B, S, 4, NH, DH) gate pre-activations from the input -> h (B, S, NH, DH).

        A loop over time (a recurrence), batched over samples, heads and widths. Step 0 starts from
        zero states: m = i, c = tanh(z), n = 1 (xlstm's vanilla step when every n is 0)."""
        B, S, _, NH, DH = wx.shape
        R = self.recurrent_kernel.reshape(NH, DH, 4 * DH)
        h = wx.new_zeros(NH, B, DH)
        c = n = m = None
        out = []
        for t in range(S):
            ry = torch.bmm(h, R).view(NH, B, 4, DH).permute(1, 2, 0, 3)       # (B, 4, NH, DH)
            i, f, z, o = (wx[:, t] + ry + self.bias).unbind(1)               # (B, NH, DH) each
            if t == 0:
                m, c, n = i, torch.tanh(z), torch.ones_like(i)
            else:
                log_f = m + F.logsigmoid(f)
                m_new = torch.maximum(i, log_f)
                ig, fg = torch.exp(i - m_new), torch.exp(log_f - m_new)
                c, n, m = fg * c + ig * torch.tanh(z), fg * n + ig, m_new
            y = torch.sigmoid(o) * c / n
            out.append(y)
            h = y.transpose(0, 1)
        return torch.stack(out, dim=1)


class _SLSTMLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kernel: int):
        super().__init__()
        self.heads = heads
        self.conv1d = _CausalConv(dim, kernel)
        self.fgate, self.igate = _Headwise(dim, heads), _Headwise(dim, heads)
        self.zgate, self.ogate = _Headwise(dim, heads), _Headwise(dim, heads)
        self.slstm_cell = _SLSTMCell(dim, heads)
        self.group_norm = _HeadNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, S, E) -> (B, S, E)."""
        B, S, E = x.shape
        c = F.silu(self.conv1d(x))
        # xlstm's order: the cell's first gate (i) comes from `fgate`, its second (f) from `igate`
        wx = torch.stack([self.fgate(c), self.igate(c), self.zgate(x), self.ogate(x)], dim=2)    # (B, S, 4, E)
        h = self.slstm_cell(wx.view(B, S, 4, self.heads, E // self.heads))
        return self.group_norm(h)


# ---------------------------------------------------------------------------- mLSTM


class _MLSTMCell(nn.Module):
    def __init__(self, inner: int, heads: int):
        super().__init__()
        self.heads = heads
        self.igate = nn.Linear(3 * inner, heads)
        self.fgate = nn.Linear(3 * inner, heads)
        self.outnorm = _HeadNorm(inner)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v: (B, S, I) -> (B, S, I): xlstm's parallel_stabilized_simple, then outnorm."""
        B, S, inner = q.shape
        qkv = torch.cat([q, k, v], dim=-1)
        ig = self.igate(qkv).transpose(1, 2)                                  # (B, NH, S)
        log_f = F.logsigmoid(self.fgate(qkv).transpose(1, 2)).cumsum(-1)     # (B, NH, S)
        q, k, v = (t.reshape(B, S, self.heads, -1).transpose(1, 2) for t in (q, k, v))     # (B, NH, S, DH)
        causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
        # log D[t, s] = sum of log f over (s, t] + i_s for s <= t
        log_d = torch.where(causal, log_f[..., :, None] - log_f[..., None, :], -math.inf) + ig[..., None, :]
        max_d = log_d.amax(dim=-1, keepdim=True)                              # row-wise stabiliser
        cmat = (q @ (k / math.sqrt(q.shape[-1])).transpose(-2, -1)) * torch.exp(log_d - max_d)
        norm = torch.maximum(cmat.sum(dim=-1, keepdim=True).abs(), torch.exp(-max_d))
        h = (cmat / (norm + MLSTM_EPS)) @ v                                   # (B, NH, S, DH)
        return self.outnorm(h.transpose(1, 2))


class _MLSTMLayer(nn.Module):
    def __init__(self, dim: int, inner: int, heads: int, kernel: int, qkv_blocksize: int):
        super().__init__()
        self.inner = inner
        self.proj_up = nn.Linear(dim, 2 * inner, bias=False)
        blocks = inner // qkv_blocksize
        self.q_proj, self.k_proj, self.v_proj = (_Headwise(inner, blocks) for _ in range(3))
        self.conv1d = _CausalConv(inner, kernel)
        self.mlstm_cell = _MLSTMCell(inner, heads)
        self.learnable_skip = nn.Parameter(torch.ones(inner))
        self.proj_down = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, S, E) -> (B, S, E)."""
        x_m, z = self.proj_up(x).split(self.inner, dim=-1)
        c = F.silu(self.conv1d(x_m))
        h = self.mlstm_cell(self.q_proj(c), self.k_proj(c), self.v_proj(x_m))
        return self.proj_down((h + self.learnable_skip * c) * F.silu(z))


class _Block(nn.Module):
    """Pre-norm residual xLSTM block: x + layer(LN(x)); an sLSTM block then x + FFN(LN(x))."""

    def __init__(self, kind: str, o: XEcgOptions):
        super().__init__()
        self.xlstm_norm = _LayerNorm(o.embed_dim)
        if kind == "s":
            self.xlstm = _SLSTMLayer(o.embed_dim, o.num_heads, o.conv_kernel)
            self.ffn_norm = _LayerNorm(o.embed_dim)
            self.ffn = _GatedFFN(o.embed_dim, o.ffn_dim, o.activation)
        else:
            self.xlstm = _MLSTMLayer(o.embed_dim, o.mlstm_dim, o.num_heads, o.conv_kernel, o.qkv_blocksize)
            self.ffn = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.xlstm(self.xlstm_norm(x))
        return x if self.ffn is None else x + self.ffn(self.ffn_norm(x))


# ---------------------------------------------------------------------------- the encoder


class _PatchEmbedding(nn.Module):
    def __init__(self, n_leads: int, dim: int, patch_size: int):
        super().__init__()
        self.conv = nn.Conv1d(n_leads, dim, patch_size, stride=patch_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, C) -> (B, T // P, D)."""
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class XEcgEncoder(nn.Module):
    """xECG's bidirectional xLSTM encoder behind coreecg's encoder interface.

    Input time-major (B, T, C), as xECG takes it (model_input.npy's layout): T a multiple of the
    patch size (a remainder is cut), any length (no position table; the release saw up to 1200).
    `lead_idx` (C,) names the standard lead of each input column; absent leads are fed as zeros, as
    bench-xecg maps a record's leads (default: the first C standard leads). NaN (coreecg's padding
    marker) is fed as 0, xECG's own padding; a patch whose first sample is 0 on every lead is
    padding (left out of the pooled mean, invalid in `forward`), xECG's rule.
    """

    def __init__(self, options: XEcgOptions | None = None, n_leads: int = 12):
        super().__init__()
        o = options or XEcgOptions()
        o.check()
        self.options, self.n_leads, self.dim, self.patch_size = o, n_leads, o.embed_dim, o.patch_size
        self.patch_embedding = _PatchEmbedding(n_leads, o.embed_dim, o.patch_size)
        self.blocks = nn.ModuleList(_Block(kind, o) for kind in o.blocks)
        self.post_blocks_norm = _LayerNorm(o.embed_dim) if o.post_norm else None
        self.source = ""                  # the weights' file, named in errors (set by coreecg.loading)

    @classmethod
    def from_config(cls, config: Config) -> "XEcgEncoder":
        """From a Config: its leads (`model.n_leads`) and sizes (`encoders.xecg`, read from the weights)."""
        return cls(config.encoders.xecg, config.model.n_leads)

    def _input(self, x: torch.Tensor, lead_idx: torch.Tensor | None) -> torch.Tensor:
        """(B, T, C) -> (B, T', n_leads): columns placed at their leads, NaN -> 0, T' whole patches."""
        B, T, C = x.shape
        n = T // self.patch_size
        if n == 0:
            raise ValueError(f"{self.source or 'xECG encoder'}: input of {T} samples (time-major (B, T, C)) is "
                             f"shorter than one patch of {self.patch_size}")
        x = fill(x[:, : n * self.patch_size])
        if lead_idx is None and C == self.n_leads:
            return x
        if lead_idx is None:
            lead_idx = default_lead_idx(C, x.device, self.n_leads)
        return x.new_zeros(B, n * self.patch_size, self.n_leads).index_copy(2, lead_idx.to(x.device), x)

    def _padding(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, L) bool: xECG's padding, a patch whose first sample sums |x| to 0."""
        return x[:, :: self.patch_size].abs().sum(dim=-1) == 0

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, n_leads), T whole patches -> the last block's tokens (B, L, D), in time order for
        an odd block count (each block after the first reads its input reversed)."""
        h = self.patch_embedding(x)
        for b, block in enumerate(self.blocks):
            h = block(h.flip(1) if b > 0 else h)
        return h if self.post_blocks_norm is None else self.post_blocks_norm(h)

    def forward(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> Encoded:
        """x: (B, T, C) -> Encoded(tokens (B, L, D), index, valid (B, L) or None, grid (1, L), pad)."""
        if visible is not None:
            raise ValueError(f"{type(self).__name__} yields a sequence over time and takes no token masks "
                             "(masked modelling needs an encoder with tokens on the (lead, time) grid)")
        x = self._input(x, lead_idx)
        tokens = self.tokens(x)
        B, L, _ = tokens.shape
        pad = self._padding(x)
        index = torch.arange(L, device=x.device).expand(B, -1)
        if not bool(pad.any()):
            return Encoded(tokens, index, None, (1, L))
        return Encoded(tokens, index, ~pad, (1, L), pad)

    def pooled(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, C) -> (B, D): xECG's `cls` (its pooling "avg": the masked mean over the patches, as
        xECG computes it, sum / count; "max": the masked maximum)."""
        x = self._input(x, lead_idx)
        tokens, pad = self.tokens(x), self._padding(x)[..., None]
        if self.options.pooling == "max":
            return tokens.masked_fill(pad, -math.inf).amax(dim=1)
        return tokens.masked_fill(pad, 0).sum(dim=1) / (tokens.shape[1] - pad.sum(dim=1)).clamp(min=1)


# ---------------------------------------------------------------------------- reading the weights


def unpack(payload: Payload) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A Hugging Face folder (its state dict, config.json) or a training checkpoint (its
    "state_dict" entry, its "config"/"hyper_parameters" if a dict) -> (candidate state, recorded config)."""
    entries = payload.entries
    state = entries.get("state_dict", entries) if isinstance(entries.get("state_dict"), dict) else entries
    recorded = payload.config
    if recorded is None:
        for key in ("config", "hyper_parameters"):
            if isinstance(entries.get(key), dict):
                recorded = entries[key]
                break
    return (state if isinstance(state, dict) else None), recorded


def _normalised(key: str) -> str:
    """A file key -> this module's name: xECG's own key mapping (a training checkpoint's leading
    "model." and "xlstm.model"), then the block stack's prefix "core.model." removed."""
    key = key[len("model."):] if key.startswith("model.") else key
    key = key.replace("xlstm.model.", "core.model.", 1) if key.startswith("xlstm.model.") else key
    return key[len("core.model."):] if key.startswith("core.model.") else key


def _is_encoder_key(key: str) -> bool:
    """A key of this encoder (or a file's sLSTM cell key, converted by `recognise`)."""
    if key in ("patch_embedding.conv.weight", "post_blocks_norm.weight"):
        return True
    m = _BLOCK.match(key)
    return m is not None and (key[m.end():] in _BLOCK_KEYS or key[m.end():] in _CELL_FILE)


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> the xECG encoder's state under this module's names (prefixes removed, the
    sLSTM cells converted from xlstm's CUDA or vanilla layout), or None when it is not xECG's.
    Dropped by name: mask_token, any head (xECG's "fc"), everything else outside the encoder.
    ValueError for an sLSTM kernel that fits neither layout."""
    sub = {_normalised(k): v for k, v in state.items() if isinstance(k, str)}
    if not all(k in sub for k in _SIGNATURE):
        return None
    out = {k: v for k, v in sub.items() if _is_encoder_key(k) and not k.endswith(_CELL_FILE)}
    for key in [k for k in sub if k.endswith(_CELL_FILE[0]) and _is_encoder_key(k)]:
        cell = key[: -len("_recurrent_kernel_")]
        out[cell + "recurrent_kernel"], bias = _converted(key, sub[key], sub.get(cell + "_bias_"))
        if bias is not None:
            out[cell + "bias"] = bias
    return out


def _converted(key: str, kernel: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """xlstm's stored sLSTM pair -> (kernel (NH, DH_in, 4, DH_out), bias (4, NH, DH)).

    CUDA backend: kernel (NH, DH_in, 4 * DH_out) (the external layout, flattened), bias (head, gate,
    dim). Vanilla backend: kernel (NH, 4 * DH_out, DH_in), bias (gate, head, dim)."""
    if kernel.ndim != 3:
        raise ValueError(f"key '{key}' has shape {tuple(kernel.shape)}, expected (NH, DH, 4 * DH) (xlstm's CUDA "
                         "layout) or (NH, 4 * DH, DH) (its vanilla layout)")
    NH, a, b = kernel.shape
    if b == 4 * a:                    # CUDA
        DH = a
        k = kernel.reshape(NH, DH, 4, DH)
        bias = None if bias is None else _bias(key, bias, NH, DH).view(NH, 4, DH).transpose(0, 1)
    elif a == 4 * b:                  # vanilla: (head, gate, out, in) -> (head, in, gate, out)
        DH = b
        k = kernel.reshape(NH, 4, DH, DH).permute(0, 3, 1, 2)
        bias = None if bias is None else _bias(key, bias, NH, DH).view(4, NH, DH)
    else:
        raise ValueError(f"key '{key}' has shape {tuple(kernel.shape)}, expected (NH, DH, 4 * DH) (xlstm's CUDA "
                         "layout) or (NH, 4 * DH, DH) (its vanilla layout)")
    return k.contiguous(), None if bias is None else bias.contiguous()


def _bias(key: str, bias: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    if bias.numel() != 4 * heads * head_dim:
        raise ValueError(f"key '{key[: -len('_recurrent_kernel_')]}_bias_' has shape {tuple(bias.shape)}, expected "
                         f"({4 * heads * head_dim},) because its recurrent kernel has {heads} heads of {head_dim}")
    return bias.reshape(-1)


def published_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This module's state dict -> xECG's file layout (the inverse of `recognise`): "core.model."
    prefixes and the sLSTM cells in xlstm's CUDA layout, as the release stores them."""
    out = {}
    for key, v in state.items():
        if key.endswith("slstm_cell.recurrent_kernel"):
            NH, DH = v.shape[0], v.shape[1]
            key, v = key[: -len("recurrent_kernel")] + "_recurrent_kernel_", v.reshape(NH, DH, 4 * DH)
        elif key.endswith("slstm_cell.bias"):
            key, v = key[: -len("bias")] + "_bias_", v.transpose(0, 1).reshape(-1)
        out[key if key.startswith("patch_embedding.") else "core.model." + key] = v.contiguous()
    return out


def _layout(o: XEcgOptions, n_leads: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every key of an encoder of sizes `o` -> (its shape, why)."""
    E, NH, P, K, inner, hidden = o.embed_dim, o.num_heads, o.patch_size, o.conv_kernel, o.mlstm_dim, o.ffn_dim
    DH, blk = E // NH, o.qkv_blocksize
    out = {"patch_embedding.conv.weight": ((E, n_leads, P), "the patch convolution (width, leads, patch size)")}
    for b, kind in enumerate(o.blocks):
        p = f"blocks.{b}."
        out[p + "xlstm_norm.weight"] = ((E,), f"the model width {E}")
        if kind == "s":
            why = f"an sLSTM block of width {E}, {NH} heads of {DH}"
            out.update({p + "xlstm.conv1d.conv.weight": ((E, 1, K), why), p + "xlstm.conv1d.conv.bias": ((E,), why),
                        p + "xlstm.slstm_cell.recurrent_kernel": ((NH, DH, 4, DH), why),
                        p + "xlstm.slstm_cell.bias": ((4, NH, DH), why),
                        p + "xlstm.group_norm.weight": ((E,), why), p + "ffn_norm.weight": ((E,), why),
                        p + "ffn.proj_up.weight": ((2 * hidden, E), f"an FFN of {hidden} on width {E}"),
                        p + "ffn.proj_down.weight": ((E, hidden), f"an FFN of {hidden} on width {E}")})
            out.update({p + f"xlstm.{g}gate.weight": ((NH, DH, DH), why) for g in "fizo"})
        else:
            why = f"an mLSTM block of inner width {inner}, {NH} heads, q/k/v blocks of {blk}, model width {E}"
            out.update({p + "xlstm.proj_up.weight": ((2 * inner, E), why),
                        p + "xlstm.proj_down.weight": ((E, inner), why),
                        p + "xlstm.conv1d.conv.weight": ((inner, 1, K), why),
                        p + "xlstm.conv1d.conv.bias": ((inner,), why),
                        p + "xlstm.learnable_skip": ((inner,), why),
                        p + "xlstm.mlstm_cell.outnorm.weight": ((inner,), why)})
            out.update({p + f"xlstm.{g}_proj.weight": ((inner // blk, blk, blk), why) for g in "qkv"})
            out.update({p + f"xlstm.mlstm_cell.{g}gate.{w}": (((NH, 3 * inner) if w == "weight" else (NH,)), why)
                        for g in "if" for w in ("weight", "bias")})
    if o.post_norm:
        out["post_blocks_norm.weight"] = ((E,), f"the model width {E}")
    return out


def _shape(state: dict[str, torch.Tensor], key: str, dims: int) -> tuple[int, ...]:
    if key not in state:
        raise ValueError(f"missing key '{key}'")
    shape = tuple(state[key].shape)
    if len(shape) != dims:
        raise ValueError(f"key '{key}' has shape {shape}, expected {dims} dimensions")
    return shape


def read_architecture(state: dict[str, torch.Tensor], recorded: dict[str, Any] | None = None) -> Config:
    """The config of an xECG encoder state (as `recognise` gives it): `model` (arch "xecg", its
    leads, a 10-s corpus window of input samples) and `encoders.xecg` (every size, from the weights;
    the activation and pooling from `recorded`, config.json). ValueError naming a missing key or one
    whose shape does not fit the others."""
    E, n_leads, P = _shape(state, "patch_embedding.conv.weight", 3)
    depth = 1 + max((int(m.group(1)) for m in map(_BLOCK.match, state) if m), default=-1)
    if depth == 0:
        raise ValueError("missing key 'blocks.0.xlstm_norm.weight' (no xLSTM block in the weights)")
    kinds = ""
    for b in range(depth):
        p = f"blocks.{b}."
        _shape(state, p + "xlstm_norm.weight", 1)
        if any(k.startswith(p + "xlstm.slstm_cell.") or k.startswith(p + "xlstm.zgate.") for k in state):
            kinds += "s"
        elif any(k.startswith(p + "xlstm.mlstm_cell.") or k.startswith(p + "xlstm.q_proj.") for k in state):
            kinds += "m"
        else:
            raise ValueError(f"block {b} is neither an sLSTM (missing key '{p}xlstm.slstm_cell.recurrent_kernel') "
                             f"nor an mLSTM block (missing key '{p}xlstm.mlstm_cell.igate.weight')")
    s, m = kinds.find("s"), kinds.find("m")
    heads = _shape(state, f"blocks.{s}.xlstm.fgate.weight", 3)[0] if s >= 0 else \
        _shape(state, f"blocks.{m}.xlstm.mlstm_cell.igate.weight", 2)[0]
    inner = _shape(state, f"blocks.{m}.xlstm.proj_down.weight", 2)[1] if m >= 0 else rounded_up(2 * E)
    blk = _shape(state, f"blocks.{m}.xlstm.q_proj.weight", 3)[2] if m >= 0 else 4
    hidden = _shape(state, f"blocks.{s}.ffn.proj_down.weight", 2)[1] if s >= 0 else rounded_up(1.3 * E)
    kernel = _shape(state, "blocks.0.xlstm.conv1d.conv.weight", 3)[2]
    rec = recorded or {}
    cls_type = rec.get("cls_type", "avg")
    if cls_type not in ("avg", "mean", "max", None):
        raise ValueError(f"config.json's cls_type {cls_type!r} is not supported: xECG's released class pools "
                         "with 'avg', 'mean' or 'max'")
    recorded_kinds = rec.get("xlstm_config")
    if isinstance(recorded_kinds, (list, tuple)) and "".join(map(str, recorded_kinds)) != kinds:
        raise ValueError(f"config.json's xlstm_config {list(recorded_kinds)} differs from the weights' blocks "
                         f"{list(kinds)}")
    if E % heads or inner % heads or inner % blk:
        raise ValueError(f"inconsistent shapes: width {E} and mLSTM width {inner} do not split into {heads} heads "
                         f"and q/k/v blocks of {blk}")
    sizes = XEcgOptions(embed_dim=E, blocks=kinds, num_heads=heads, patch_size=P, conv_kernel=kernel,
                        qkv_blocksize=blk, mlstm_dim=inner, ffn_dim=hidden,
                        post_norm="post_blocks_norm.weight" in state,
                        activation=str(rec.get("activation_fn") or "gelu"),
                        pooling="max" if cls_type == "max" else "avg")
    for key, (shape, why) in _layout(sizes, n_leads).items():
        if key not in state:
            raise ValueError(f"missing key '{key}'")
        if tuple(state[key].shape) != shape:
            raise ValueError(f"key '{key}' has shape {tuple(state[key].shape)}, expected {shape} because of {why}")
    return Config(model=ModelConfig(arch=NAME, n_leads=n_leads, input_samples=CORPUS_SAMPLES),
                  encoders=EncoderOptions({NAME: sizes}))


# the block keys this module knows (either kind), relative to "blocks.<b>."
_BLOCK_KEYS = frozenset(k.split(".", 2)[2] for k in _layout(XEcgOptions(blocks="sm"), 12) if k.startswith("blocks."))

XEcgEncoder.output_kind = "sequence"
register_encoder(NAME)(XEcgEncoder)
register(PublishedFamily(
    releases=(
        ('xECG_base_model_v1',
         'Hugging Face riccardolunelli/xECG_base_model_v1 (the folder: config.json + model.safetensors)'),
    ),
    name=NAME, title="xECG (BenchECG and xECG, 2025)", label="xECG", recognise=recognise, unpack=unpack,
    read_architecture=read_architecture, build=XEcgEncoder.from_config,
    # a corpus cannot say "no filter, no normalisation": the gentlest settings its checks allow; the
    # exact input is CONTRACT (raw mV)
    preprocess=PreprocessConfig(sampling_rate=RATE, window_s=CORPUS_SAMPLES / RATE, highpass_hz=0.05,
                                lowpass_hz=49.0, standardize="lead"),
    contract=CONTRACT, module="coreecg.model.published.xecg.XEcgEncoder",
    licence="MIT (the Hugging Face card's metadata for riccardolunelli/xECG_base_model_v1, code and weights); "
            "xlstm (whose modules this re-implements) is Apache-2.0",
    pooling="mean over the last block's patch tokens (xECG's cls_type 'avg'), a patch whose first sample is 0 "
            "on all 12 leads left out",
    normalisation="none (raw mV)",
    pretraining="SimDINOv2 on CODE (the full 2.3M-exam dataset, of which CODE-15% is a part), Chapman-Ningbo "
                "(PhysioNet 'A large scale 12-lead ECG database for arrhythmia study' 1.0.0) and St Petersburg "
                "INCART (bench-xecg's pretrain_run_config.yaml); not checked by coreecg's leakage guard",
    pretrained_on=("code", "code15", "chapman", "ningbo", "incart"),
    commercial_use=True,
))
