"""HuBERT-ECG (Coppola et al. 2024): its published encoder, read as data and run by coreecg's own code.

HuBERT-ECG is a stock Hugging Face `HubertModel` (its config.json says model_type "hubert_ecg")
pretrained on flattened 12-lead ECGs, plus two pretraining heads. Files:

    a Hugging Face folder   config.json (every size: hidden_size, num_hidden_layers, num_attention_heads,
                            intermediate_size, conv_dim/conv_kernel/conv_stride, ...) + model.safetensors
                            (the HuBERTECG state dict): Edoardo-BS/hubert-ecg-{small,base,large}
    a legacy torch.save     {"model_state_dict": the same keys, "model_config": the pickled config
                            (read inert: its attributes kept as data), "pretraining_vocab_sizes", ...}
    a fine-tuned classifier the same keys under "hubert_ecg." beside its classifier head

Keys of the encoder (D width, C_i the i-th convolution's channels, K the layer index):

    feature_extractor.conv_layers.{i}.conv.weight (C_i, C_{i-1}, k_i)     bias-free, stride s_i, GELU after
    feature_extractor.conv_layers.0.layer_norm.{weight,bias} (C_0,)       a GroupNorm with one group per
                                                                          channel (despite the name), conv 0 only
    feature_projection.layer_norm (C_last,), feature_projection.projection (D, C_last)    LayerNorm, then Linear
    encoder.pos_conv_embed.conv.bias (D,) and its weight-normed weight: parametrizations.weight.original0
        (g: (1, 1, k)) and .original1 (v: (D, D / groups, k)) as torch's parametrization saves it, or
        weight_g / weight_v (older saves; renamed here), or a plain .weight (weight norm removed; g and v
        recovered exactly)
    encoder.layer_norm (D,)                                                after adding the positions
    encoder.layers.K.attention.{q,k,v,out}_proj (D, D) + bias, encoder.layers.K.layer_norm,
    encoder.layers.K.feed_forward.{intermediate_dense, output_dense}, encoder.layers.K.final_layer_norm

Dropped by name (never used on the pooled path): `final_proj.*` and `label_embedding.*` (the
pretraining heads), `masked_spec_embed` (the mask token of training), a classifier's head.

The computation (the stock Hubert forward, checked against the original's embedding in
tests/test_published_hubert_ecg.py): x (B, T) -> (B, 1, T) -> five convolutions (the first
followed by GroupNorm, each by GELU) -> (B, L, C) -> LayerNorm, Linear -> (B, L, D); the positional
convolution (kernel 128, padding 64, 16 groups; its last output step dropped as the kernel is
even), GELU, added to the features; LayerNorm; then post-LN layers: x = LN(x + attn(x)),
x = LN(x + W2 gelu(W1 x)). `last_hidden_state` is the last layer's output (no norm after it), the
pooled embedding its mean over the L tokens. T = 6000 gives L = 93 (stride 64, receptive field 400).

The architecture is read from the weights (widths, kernels, depth, the positional kernel and
groups, whether the convolutions have a bias and the projection a LayerNorm); the head count, the
strides and the LayerNorm eps are not in the weights: config.json (or the legacy "model_config")
gives them, else HuBERT's defaults (heads = D / 64, as all three released sizes; strides 4, 2, 2,
2, 2; eps 1e-5). A recorded config asking for a structure this module does not implement
(do_stable_layer_norm, feat_extract_norm "layer", conv_pos_batch_norm, an activation other than
GELU) is refused with a ValueError.

The input is fixed: the 12 standard leads flattened lead-major and decimated (CONTRACT below);
`lead_idx` is ignored, and the layout is (B, 6000), not (B, C, T). The filter of the decimation
runs across the lead boundaries, so no lead can be left out.

No HuBERT-ECG or transformers code is used (its licence is CC BY-NC 4.0): this module names its
parameters as the published state dicts do, so those load with `load_state_dict` unchanged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import STANDARD_LEADS, Config, ModelConfig, PreprocessConfig
from coreecg.config.encoders import EncoderOptions
from coreecg.data.contract import Crop, Decimate, FirBandpass, Flatten, InputContract, Normalise, Resample, Step
from coreecg.encoders.build import register_encoder
from coreecg.encoders.published.hubert_ecg import HubertEcgOptions
from coreecg.model.encoder import Encoded
from coreecg.model.padding import fill
from coreecg.model.published.registry import PublishedFamily, register

NAME = "hubert_ecg"
HEAD_WIDTH = 64                       # HuBERT's head width (small 512/8, base 768/12): heads when not recorded
INPUT_SAMPLES = 6000                  # 12 leads x 2500 samples (5 s at 500 Hz), decimated by 5
_CONV = re.compile(r"^feature_extractor\.conv_layers\.(\d+)\.conv\.weight$")
_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.")
_POS = "encoder.pos_conv_embed.conv."
_POS_G, _POS_V = _POS + "parametrizations.weight.original0", _POS + "parametrizations.weight.original1"
_SIGNATURE = ("feature_extractor.conv_layers.0.conv.weight", "feature_projection.projection.weight",
              _POS + "bias", "encoder.layers.0.attention.q_proj.weight", "encoder.layers.0.final_layer_norm.weight")
_KEEP = ("feature_extractor.", "feature_projection.", "encoder.")
_PREFIXES = ("", "hubert_ecg.", "hubert.")        # a bare HuBERTECG; a fine-tuned classifier's backbone
# the structure this module implements, as config.json spells it (any other value: ValueError)
_FIXED = {"do_stable_layer_norm": False, "feat_extract_norm": "group", "conv_pos_batch_norm": False,
          "hidden_act": "gelu", "feat_extract_activation": "gelu"}


# ---------------------------------------------------------------------------- the input contract


@dataclass(frozen=True)
class BiosppyFirBandpass(Step):
    """biosppy's filter_signal(ftype="FIR", band="bandpass", order=int(order_s * fs)) at the record's
    own rate: the order made odd (500 Hz: 150 -> 151 taps; 100 Hz: 31; 250 Hz: 75), firwin (Hamming)
    with pass_zero=False, then filtfilt (FirBandpass with that many taps)."""

    low: float = 0.05
    high: float = 47.0
    order_s: float = 0.3

    def taps(self, fs: float) -> int:
        n = int(self.order_s * fs)
        return n + 1 if n % 2 == 0 else n

    def apply(self, x, fs):
        return FirBandpass(self.low, self.high, self.taps(fs), "hamming").apply(x, fs)

    def describe(self):
        return (f"FIR band-pass {self.low:g}-{self.high:g} Hz at the record's own rate, int({self.order_s:g} x fs) "
                "taps made odd (151 at 500 Hz; Hamming window, firwin), zero-phase filtfilt (odd padding, 3 x taps)")


@dataclass(frozen=True)
class NanToWindowMean(Step):
    """NaN -> the mean of the window's other samples, over every lead and time together (HuBERT-ECG's
    dataset: `np.where(mask, x[~mask].mean(), x)` on the (12, 2500) crop); an all-NaN window -> 0."""

    def apply(self, x, fs):
        if not np.isnan(x).any():
            return x, fs
        with np.errstate(invalid="ignore"):
            mean = np.nan_to_num(np.nanmean(x, axis=(-2, -1), keepdims=True)) if not np.isnan(x).all() \
                else np.zeros(x.shape[:-2] + (1, 1))
        return np.where(np.isnan(x), mean, x), fs

    def describe(self):
        return "NaN -> the mean of the window's other samples (all leads and time together)"


CONTRACT = InputContract(
    leads=STANDARD_LEADS, sampling_rate=500, window_samples=2500,
    steps=(BiosppyFirBandpass(0.05, 47.0, 0.3), Resample(500, "fft", "floor"),
           Normalise("minmax", "lead", 1e-8, "add", (-1.0, 1.0)), Crop(2500), NanToWindowMean(), Flatten(),
           Decimate(5)),
    layout="flat",
    notes="HuBERT-ECG's code/utils.py ecg_preprocessing then its ECGDataset (test path): the band-pass runs at "
          "the record's own rate before the FFT resampling to 500 Hz; the min-max scaling spans the whole record "
          "before the crop to its first 5 s (training used a random 5 s crop); the decimation's filter runs across "
          "the lead boundaries of the flattened sequence. A record shorter than 5 s gives a shorter input, as in "
          "the original.")


# ---------------------------------------------------------------------------- the modules


class _ConvLayer(nn.Module):
    """feature_extractor.conv_layers.i: Conv1d (bias-free as published), GroupNorm with one group
    per channel on the first layer only (named layer_norm, as HF does), GELU."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, bias: bool, norm: bool):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, bias=bias)
        self.layer_norm = nn.GroupNorm(c_out, c_out, affine=True) if norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return F.gelu(x if self.layer_norm is None else self.layer_norm(x))


class _FeatureEncoder(nn.Module):
    def __init__(self, o: HubertEcgOptions):
        super().__init__()
        chans = (1, *o.conv_dim)
        self.conv_layers = nn.ModuleList(
            _ConvLayer(chans[i], chans[i + 1], k, s, o.conv_bias, i == 0)
            for i, (k, s) in enumerate(zip(o.conv_kernel, o.conv_stride)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, C_last, L)."""
        x = x[:, None]
        for layer in self.conv_layers:
            x = layer(x)
        return x


class _FeatureProjection(nn.Module):
    def __init__(self, o: HubertEcgOptions):
        super().__init__()
        self.layer_norm = nn.LayerNorm(o.conv_dim[-1], eps=o.layer_norm_eps) if o.feat_proj_layer_norm else None
        self.projection = nn.Linear(o.conv_dim[-1], o.hidden_size)
        self.dropout = nn.Dropout(o.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, C_last) -> (B, L, D)."""
        return self.dropout(self.projection(x if self.layer_norm is None else self.layer_norm(x)))


class _PositionalConv(nn.Module):
    """Grouped Conv1d over time with weight norm over (out, in) per kernel tap (torch's
    parametrization, dim=2: the keys HF saves), the last step dropped for an even kernel, GELU."""

    def __init__(self, dim: int, kernel: int, groups: int):
        super().__init__()
        conv = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=groups)
        self.conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)
        self.trim = 1 if kernel % 2 == 0 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, L, D)."""
        h = self.conv(x.transpose(1, 2))
        if self.trim:
            h = h[..., : -self.trim]
        return F.gelu(h).transpose(1, 2)


class _Attention(nn.Module):
    """Multi-head self-attention, separate biased q/k/v projections, on SDPA (scale 1/sqrt(head width))."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, L, D)."""
        B, L, D = x.shape
        q, k, v = (p(x).view(B, L, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(B, L, D))


class _FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.intermediate_dense, self.output_dense = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.output_dense(self.dropout(F.gelu(self.intermediate_dense(x)))))


class _Layer(nn.Module):
    """A post-LN transformer layer: x = LN(x + attn(x)); x = LN'(x + ff(x))."""

    def __init__(self, o: HubertEcgOptions):
        super().__init__()
        self.attention = _Attention(o.hidden_size, o.num_heads, o.dropout)
        self.layer_norm = nn.LayerNorm(o.hidden_size, eps=o.layer_norm_eps)
        self.feed_forward = _FeedForward(o.hidden_size, o.intermediate_size, o.dropout)
        self.final_layer_norm = nn.LayerNorm(o.hidden_size, eps=o.layer_norm_eps)
        self.dropout = nn.Dropout(o.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(x + self.dropout(self.attention(x)))
        return self.final_layer_norm(x + self.feed_forward(x))


class _Transformer(nn.Module):
    def __init__(self, o: HubertEcgOptions):
        super().__init__()
        self.pos_conv_embed = _PositionalConv(o.hidden_size, o.pos_conv_kernel, o.pos_conv_groups)
        self.layer_norm = nn.LayerNorm(o.hidden_size, eps=o.layer_norm_eps)
        self.dropout = nn.Dropout(o.dropout)
        self.layers = nn.ModuleList(_Layer(o) for _ in range(o.num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) projected features -> (B, L, D) the last layer's output."""
        x = self.dropout(self.layer_norm(x + self.pos_conv_embed(x)))
        for layer in self.layers:
            x = layer(x)
        return x


class HubertEcgEncoder(nn.Module):
    """HuBERT-ECG's encoder behind coreecg's `Encoder` interface (`pooled`, `forward` -> Encoded).

    x: (B, T) (or (B, 1, T)): CONTRACT's flattened, decimated 12-lead input, T = 6000 for the
    published 5 s window (any T of at least the receptive field, 400 samples, runs). `lead_idx` is
    ignored: the model takes the 12 standard leads in their fixed order. NaN (none comes out of
    CONTRACT) is set to 0 (coreecg.model.padding.fill).
    """

    output_kind = "sequence"

    def __init__(self, options: HubertEcgOptions | None = None, n_leads: int = 12):
        super().__init__()
        o = options or HubertEcgOptions()
        o.check()
        self.options, self.n_leads, self.dim, self.patch_size = o, n_leads, o.hidden_size, o.stride
        self.feature_extractor = _FeatureEncoder(o)
        self.feature_projection = _FeatureProjection(o)
        self.encoder = _Transformer(o)
        self.source = ""                  # the weights' file, named in errors (set by coreecg.loading)

    @classmethod
    def from_config(cls, config: Config) -> "HubertEcgEncoder":
        """From a Config: its sizes `encoders.hubert_ecg` (read from the weights)."""
        return cls(config.encoders.hubert_ecg, config.model.n_leads)

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 3 and x.shape[1] == 1:
            x = x[:, 0]
        if x.ndim != 2:
            raise ValueError(f"{self.source or 'HuBERT-ECG encoder'}: input of shape {tuple(x.shape)}; it takes "
                             f"(B, {INPUT_SAMPLES}): the 12 leads flattened and decimated (its CONTRACT)")
        return fill(x)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T) -> `last_hidden_state` (B, L, D), L = the conv stack's output length."""
        h = self.feature_extractor(self._flat(x)).transpose(1, 2)
        return self.encoder(self.feature_projection(h))

    def forward(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> Encoded:
        """x: (B, T) -> Encoded(tokens (B, L, D), index (B, L), None, grid (1, L)); `visible` is
        refused (a sequence over time takes no token masks)."""
        if visible is not None:
            raise ValueError("HuBERT-ECG yields a sequence over time and takes no token masks (masked modelling "
                             "needs an encoder with tokens on the (lead, time) grid)")
        t = self.tokens(x)
        B, L, _ = t.shape
        return Encoded(t, torch.arange(L, device=t.device).expand(B, -1), None, (1, L))

    def pooled(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """HuBERT-ECG's embedding: (B, T) -> (B, D), the mean over tokens of `last_hidden_state`."""
        return self.tokens(x).mean(dim=1)


# ---------------------------------------------------------------------------- reading the weights


def unpack(payload: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A `files.Payload` -> (candidate state dict, recorded config): an HF folder's safetensors
    state and config.json; a legacy dict's "model_state_dict" and "model_config" (a pickled config
    object read inert: its attributes); else a "model"/"state_dict" entry or the bare dict."""
    entries = payload.entries
    recorded = payload.config if isinstance(payload.config, dict) else None
    for key in ("model_state_dict", "state_dict", "model"):
        if isinstance(entries.get(key), dict):
            state = entries[key]
            break
    else:
        state = entries
    if recorded is None:
        cfg = entries.get("model_config", entries.get("config"))
        if not isinstance(cfg, dict):          # an Inert placeholder of HuBERTECGConfig: its __dict__
            cfg = getattr(cfg, "state", None)
        recorded = cfg if isinstance(cfg, dict) else None
    return (state if isinstance(state, dict) else None), recorded


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> the encoder's state (a "hubert_ecg."/"hubert." prefix removed; the positional
    weight norm in torch's parametrization names), or None when it is not HuBERT's. Only the
    feature_extractor/feature_projection/encoder keys are kept: the pretraining heads (final_proj,
    label_embedding), masked_spec_embed and a classifier's head are dropped."""
    for prefix in _PREFIXES:
        sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if all(k in sub for k in _SIGNATURE):
            kept = {k: v for k, v in sub.items() if k.startswith(_KEEP)}
            return _weight_norm_names(kept)
    return None


def _weight_norm_names(state: dict[str, Any]) -> dict[str, Any]:
    """weight_g/weight_v (torch.nn.utils.weight_norm saves) -> parametrizations.weight.original0/1;
    a plain weight -> g = its norm over (out, in) per tap, v = itself (g * v / |v| is the weight)."""
    out = dict(state)
    if _POS + "weight_g" in out or _POS + "weight_v" in out:
        out[_POS_G] = out.pop(_POS + "weight_g", None)
        out[_POS_V] = out.pop(_POS + "weight_v", None)
        if out[_POS_G] is None or out[_POS_V] is None:
            missing = _POS + ("weight_g" if out[_POS_G] is None else "weight_v")
            raise ValueError(f"missing key {missing!r} (the positional convolution's weight norm)")
    elif _POS + "weight" in out and _POS_V not in out:
        w = out.pop(_POS + "weight")
        out[_POS_G], out[_POS_V] = torch.linalg.vector_norm(w, dim=(0, 1), keepdim=True), w
    return out


def _shape(state: dict[str, Any], key: str, expected: tuple[int, ...], why: str) -> None:
    if key not in state:
        raise ValueError(f"missing key {key!r}")
    got = tuple(state[key].shape)
    if got != expected:
        raise ValueError(f"key {key!r} has shape {got}, expected {expected} because {why}")


def read_architecture(state: dict[str, torch.Tensor], recorded: dict[str, Any] | None = None) -> Config:
    """The config of a HuBERT-ECG encoder state dict: `model` (arch "hubert_ecg", 12 leads, 6000
    input samples) and `encoders.hubert_ecg` (its sizes); ValueError naming the key whose absence or
    shape does not fit. `recorded`: config.json (heads, strides, eps, and the structure checked)."""
    rec = recorded or {}
    if rec.get("model_type", NAME) not in (NAME, "hubert"):     # wav2vec2 has the same keys
        raise ValueError(f"config model_type={rec['model_type']!r}: not a HuBERT(-ECG) model")
    for key, value in _FIXED.items():
        if key in rec and rec[key] != value:
            raise ValueError(f"config {key}={rec[key]!r}: this module implements HuBERT-ECG's {key}={value!r} only")
    for key in _SIGNATURE + (_POS_G, _POS_V, "encoder.layer_norm.weight"):
        if key not in state:
            raise ValueError(f"missing key {key!r}")
    n_conv = 1 + max(int(m.group(1)) for m in map(_CONV.match, state) if m)
    dims, kernels, c_in = [], [], 1
    for i in range(n_conv):
        key = f"feature_extractor.conv_layers.{i}.conv.weight"
        if key not in state:
            raise ValueError(f"missing key {key!r}")
        w = state[key]
        if w.ndim != 3 or w.shape[1] != c_in:
            raise ValueError(f"key {key!r} has shape {tuple(w.shape)}, expected ({w.shape[0]}, {c_in}, k) because "
                             f"convolution {i} reads {c_in} channels")
        dims.append(int(w.shape[0]))
        kernels.append(int(w.shape[2]))
        c_in = dims[-1]
        if i and f"feature_extractor.conv_layers.{i}.layer_norm.weight" in state:
            raise ValueError(f"key 'feature_extractor.conv_layers.{i}.layer_norm.weight': a norm after every "
                             "convolution (feat_extract_norm 'layer') is not HuBERT-ECG's structure")
    conv_bias = "feature_extractor.conv_layers.0.conv.bias" in state
    for i in range(n_conv):
        if conv_bias:
            _shape(state, f"feature_extractor.conv_layers.{i}.conv.bias", (dims[i],), f"convolution {i} has {dims[i]}"
                   " channels")
    for part in ("weight", "bias"):
        _shape(state, f"feature_extractor.conv_layers.0.layer_norm.{part}", (dims[0],),
               f"the GroupNorm after convolution 0 has one group per channel ({dims[0]})")
    dim = int(state["feature_projection.projection.weight"].shape[0])
    _shape(state, "feature_projection.projection.weight", (dim, dims[-1]), f"it projects the last convolution's "
           f"{dims[-1]} channels")
    _shape(state, "feature_projection.projection.bias", (dim,), f"the width is {dim}")
    feat_ln = "feature_projection.layer_norm.weight" in state
    if feat_ln:
        for part in ("weight", "bias"):
            _shape(state, f"feature_projection.layer_norm.{part}", (dims[-1],), "it normalises the last "
                   f"convolution's {dims[-1]} channels")
    v = state[_POS_V]
    if v.ndim != 3 or v.shape[0] != dim or v.shape[1] < 1 or dim % v.shape[1]:
        raise ValueError(f"key {_POS_V!r} has shape {tuple(v.shape)}, expected ({dim}, {dim} / groups, k) because "
                         f"the positional convolution maps the width {dim} onto itself")
    groups, pos_kernel = dim // int(v.shape[1]), int(v.shape[2])
    _shape(state, _POS_G, (1, 1, pos_kernel), "the weight norm keeps one gain per kernel tap (dim=2)")
    _shape(state, _POS + "bias", (dim,), f"the width is {dim}")
    for part in ("weight", "bias"):
        _shape(state, f"encoder.layer_norm.{part}", (dim,), f"the width is {dim}")
    depth = 1 + max(int(m.group(1)) for m in map(_LAYER.match, state) if m)
    hidden = int(state["encoder.layers.0.feed_forward.intermediate_dense.weight"].shape[0]) \
        if "encoder.layers.0.feed_forward.intermediate_dense.weight" in state else 0
    for k in range(depth):
        p = f"encoder.layers.{k}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _shape(state, f"{p}attention.{name}.weight", (dim, dim), f"attention maps the width {dim} onto itself")
            _shape(state, f"{p}attention.{name}.bias", (dim,), f"the width is {dim}")
        _shape(state, f"{p}feed_forward.intermediate_dense.weight", (hidden, dim), f"layer 0's MLP is {hidden} wide")
        _shape(state, f"{p}feed_forward.intermediate_dense.bias", (hidden,), f"layer 0's MLP is {hidden} wide")
        _shape(state, f"{p}feed_forward.output_dense.weight", (dim, hidden), f"layer 0's MLP is {hidden} wide")
        _shape(state, f"{p}feed_forward.output_dense.bias", (dim,), f"the width is {dim}")
        for norm in ("layer_norm", "final_layer_norm"):
            for part in ("weight", "bias"):
                _shape(state, f"{p}{norm}.{part}", (dim,), f"the width is {dim}")
    heads = rec.get("num_attention_heads")
    heads = int(heads) if isinstance(heads, int) and heads > 0 else max(1, dim // HEAD_WIDTH)
    strides = tuple(int(s) for s in rec.get("conv_stride", HubertEcgOptions.conv_stride))
    if len(strides) != n_conv:
        raise ValueError(f"{n_conv} convolutions in the weights but {len(strides)} strides "
                         f"({'recorded' if 'conv_stride' in rec else 'HuBERT defaults'}: {list(strides)})")
    if dim % heads or dim % groups:
        raise ValueError(f"width {dim} is not divisible by {heads} heads / {groups} positional groups")
    sizes = HubertEcgOptions(hidden_size=dim, num_layers=depth, num_heads=heads, intermediate_size=hidden,
                             conv_dim=tuple(dims), conv_kernel=tuple(kernels), conv_stride=strides,
                             conv_bias=conv_bias, feat_proj_layer_norm=feat_ln, pos_conv_kernel=pos_kernel,
                             pos_conv_groups=groups, layer_norm_eps=float(rec.get("layer_norm_eps", 1e-5)))
    return Config(model=ModelConfig(arch=NAME, n_leads=12, input_samples=INPUT_SAMPLES),
                  encoders=EncoderOptions({NAME: sizes}))


HubertEcgEncoder.output_kind = "sequence"
register_encoder(NAME)(HubertEcgEncoder)
register(PublishedFamily(
    releases=(
        ('hubert-ecg-small',
         'Hugging Face Edoardo-BS/hubert-ecg-small (the folder: config.json + model.safetensors)'),
        ('hubert-ecg-base',
         'Hugging Face Edoardo-BS/hubert-ecg-base (the folder: config.json + model.safetensors)'),
        ('hubert-ecg-large',
         'Hugging Face Edoardo-BS/hubert-ecg-large (the folder: config.json + model.safetensors)'),
    ),
    name=NAME, title="HuBERT-ECG (Coppola et al. 2024)", label="HuBERT-ECG", recognise=recognise, unpack=unpack,
    read_architecture=read_architecture, build=HubertEcgEncoder.from_config,
    # the closest corpus settings (coreecg's Butterworth, z-score): the exact input is CONTRACT
    preprocess=PreprocessConfig(sampling_rate=500, highpass_hz=0.05, lowpass_hz=47.0, standardize="lead"),
    contract=CONTRACT, module="coreecg.model.published.hubert_ecg.HubertEcgEncoder",
    licence="CC BY-NC 4.0 (Edoar-do/HuBERT-ECG code and the Edoardo-BS/hubert-ecg-* weights, non-commercial); "
            "check it before any commercial use",
    pooling="mean over the tokens of the last transformer layer's output (last_hidden_state; no norm after it)",
    normalisation="min-max to [-1, 1] per lead over the whole record (+1e-8 in the denominator), before the 5 s crop",
    pretraining="9.1 million 12-lead ECGs (the paper) from the databases its repository's figures/metadata name: "
                "PTB-XL, PTB, CPSC 2018 and CPSC-Extra, Georgia, Chapman-Shaoxing, Ningbo, SPH (the CinC 2020/2021 "
                "versions), Ribeiro's CODE (the full set, of which CODE-15% is a part), SaMi-Trop, Hefei, "
                "MIMIC-IV-ECG; "
                "not checked by coreecg's leakage guard",
    pretrained_on=("ptbxl", "ptb", "cpsc2018", "cpsc2018_extra", "georgia", "chapman", "ningbo", "sph", "code",
                   "code15", "samitrop", "hefei", "mimic_iv_ecg"),
    commercial_use=False,
))
