"""ECG-FM (McKeen et al. 2024): its published encoder, read as data and run by coreecg's own code.

ECG-FM is a wav2vec 2.0 encoder pretrained with wav2vec 2.0 + CMSC + random lead masking on
fairseq-signals. Its two released files (HuggingFace wanglab/ecg-fm) are fairseq checkpoints,
`torch.save` dicts readable with weights_only=True:

    mimic_iv_ecg_physionet_pretrained.pt   {"args": None, "cfg": the hydra config as a plain dict
                                            ("model": the sizes), "model": Wav2Vec2CMSCModel's state,
                                            "criterion", "optimizer_history", "task_state",
                                            "extra_state", "last_optimizer_state" (Adam moments)}
    mimic_iv_ecg_finetuned.pt              the same entries; "model": ECGTransformerClassificationModel's
                                            state: the encoder under "encoder.", the head "proj.*"

A `<file stem>.yaml` beside a file (the HF upload has one) is read as its recorded config when
the file's own "cfg" is not a plain dict.

Keys of the encoder (C the convolutions' width, D the model width, K the position kernel, i a
convolution, j a transformer layer):

    feature_extractor.conv_layers.i.0.weight (C_i, C_{i-1}, k_i)   Conv1d, no bias (conv_bias False)
    feature_extractor.conv_layers.0.2.{weight,bias} (C_0,)         GroupNorm(C_0 groups), first conv only
    layer_norm.{weight,bias} (C,)                                  LayerNorm of the conv features
    post_extract_proj.{weight,bias} (D, C)                         only when C != D
    conv_pos.pos_conv.0.bias (D,)                                  weight-normed Conv1d(D, D, K, groups G):
    conv_pos.pos_conv.0.parametrizations.weight.original0 (1, 1, K)    g (torch's parametrization), or
    conv_pos.pos_conv.0.parametrizations.weight.original1 (D, D/G, K)  v; legacy files name them
                                                                   weight_g / weight_v (renamed here)
    encoder.layer_norm.{weight,bias} (D,)                          applied BEFORE the layers (post-LN)
    encoder.layers.j.self_attn.{q,k,v,out}_proj.{weight,bias} (D, D)
    encoder.layers.j.{self_attn_layer_norm,final_layer_norm}.{weight,bias} (D,)
    encoder.layers.j.fc1 (F, D), encoder.layers.j.fc2 (D, F)

Dropped by name: the pretraining model's `mask_emb`, `quantizer.*`, `project_q.*`, `final_proj.*`,
`target_glu.*`, `input_quantizer.*`, `project_inp.*`, and the fine-tuned head `proj.*`; every key
outside the list above is left out.

The computation, (B, 12, T) -> (B, L, D), L = T // 16 at the published size (2500 -> 156):
each conv layer Conv1d -> (layer 0) GroupNorm in float32 -> GELU; LayerNorm(C); Linear(C, D);
x + GELU(conv_pos(x)) with the conv's last output step dropped (even kernel, padding K // 2);
LayerNorm(D); `depth` layers of x = LN(x + MHA(x)), x = LN(x + fc2(GELU(fc1(x)))); no final norm.
The weight norm is torch's (dim=2): weight[:, :, k] = g[k] v[:, :, k] / ||v[:, :, k]||.
Pooling: the pretrained file's embedding (the ECG-FM benchmark's) is the mean over tokens; the
fine-tuned file's (ECG-FM's quickstart, and what its head reads) is per channel sum / count of
non-zero entries (`options.pooling`, "mean" or "nonzero", read from the recorded config's model
name). The two agree unless an output is exactly 0.

The architecture is read from the weights' shapes: the conv widths and kernels from each conv's
weight, the input leads from the first conv, D from encoder.layer_norm, F from fc1, the depth
from the layer keys, K and the groups from the position conv's v (D / groups input channels).
Not in the weights, so from the recorded config when it has them, else ECG-FM's values: the
strides (`conv_feature_layers`, a Python expression string read with a small literal parser,
never eval; else stride = kernel) and the head count (`encoder_attention_heads`; else 12).

Traps: the head count is not in the weights (12 at every size: 48 wide -> 4-wide heads); the
conv_pos keys come in two styles (legacy weight_g/weight_v and torch's parametrizations); an even
position kernel drops the last step (SamePad); 2500 samples do not divide by 16 (the last 4 are
not read, so model.input_samples is 2496 while the contract's window stays 2500); the fine-tuned
pooling counts non-zero entries per channel, not tokens.

No fairseq-signals or ECG-FM code is used: this module names its parameters as the published
state dicts do, so those load with `load_state_dict` unchanged.
"""
from __future__ import annotations

import ast
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from coreecg.config import STANDARD_LEADS, Config, ConfigError, ModelConfig, PreprocessConfig
from coreecg.config.encoders import EncoderOptions
from coreecg.data.contract import ConstantLeads, InputContract, Normalise, Resample, Window
from coreecg.encoders.build import register_encoder
from coreecg.encoders.published.ecg_fm import EcgFmOptions
from coreecg.model.encoder import Encoded, masked_mean
from coreecg.model.padding import assumed_unpadded, fill
from coreecg.model.published.files import Payload
from coreecg.model.published.registry import PublishedFamily, register
from coreecg.model.sequence import SequenceEncoder

NAME = "ecg_fm"
HEADS = 12                          # ECG-FM's encoder_attention_heads (not in the weights)
RATE, WINDOW = 500, 2500            # the quickstart's ECGInputSchema: 500 Hz, 2500 samples
_SIGNATURE = ("feature_extractor.conv_layers.0.0.weight", "conv_pos.pos_conv.0.bias",
              "encoder.layers.0.self_attn.q_proj.weight", "encoder.layer_norm.weight")
_KEEP = re.compile(
    r"^(feature_extractor\.conv_layers\.\d+\.[02]\.(weight|bias)"
    r"|layer_norm\.(weight|bias)|post_extract_proj\.(weight|bias)"
    r"|conv_pos\.pos_conv\.0\.(bias|weight_g|weight_v|parametrizations\.weight\.original[01])"
    r"|encoder\.layer_norm\.(weight|bias)"
    r"|encoder\.layers\.\d+\.(self_attn\.[qkv]_proj|self_attn\.out_proj|self_attn_layer_norm|fc1|fc2"
    r"|final_layer_norm)\.(weight|bias))$")
_LEGACY = {"conv_pos.pos_conv.0.weight_g": "conv_pos.pos_conv.0.parametrizations.weight.original0",
           "conv_pos.pos_conv.0.weight_v": "conv_pos.pos_conv.0.parametrizations.weight.original1"}
_CONV = re.compile(r"^feature_extractor\.conv_layers\.(\d+)\.0\.weight$")
_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.")
_FINETUNED = ("ecg_transformer_classifier", "ecg_transformer_finetuning")     # cfg model names: nonzero pooling

# ECG-FM's quickstart (ecg-transform 0.1.3): reorder to I..V6, linear resampling to 500 Hz,
# constant leads -> 0, per-lead z-score over the whole record (+1e-8), non-overlapping 5 s windows.
CONTRACT = InputContract(
    leads=STANDARD_LEADS, sampling_rate=RATE, window_samples=WINDOW,
    steps=(Resample(rate=RATE, method="linear"), ConstantLeads(),
           Normalise(method="zscore", axis="lead", eps=1e-8, eps_mode="add"), Window(WINDOW)),
    layout="channels_first",
    notes="no filtering; the z-score is over the whole record before it is cut into windows; the quickstart "
          "predicts every window and aggregates per record (mean or max); the ECG-FM benchmark feeds raw mV "
          "instead (its normalisation off)")


class _Fp32GroupNorm(nn.GroupNorm):
    """GroupNorm computed in float32 whatever the input's dtype (fairseq's, under autocast)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x.float(), self.num_groups, self.weight.float(), self.bias.float(), self.eps).type_as(x)


class _DropLast(nn.Module):
    """(B, D, L + 1) -> (B, D, L): an even kernel padded by K // 2 gives one step too many."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., :-1]


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x.float()).type_as(x)


class _FeatureExtractor(nn.Module):
    """Strided convolutions: (B, C_in, T) -> (B, C, L). Layer i: Conv1d -> Dropout -> (i = 0:
    GroupNorm with one group per channel) -> GELU, as `conv_layers.i.{0,1,2,3}`."""

    def __init__(self, in_leads: int, dims: tuple[int, ...], kernels: tuple[int, ...], strides: tuple[int, ...],
                 bias: bool):
        super().__init__()
        layers, prev = [], in_leads
        for i, (d, k, s) in enumerate(zip(dims, kernels, strides)):
            norm = [_Fp32GroupNorm(d, d)] if i == 0 else []
            layers.append(nn.Sequential(nn.Conv1d(prev, d, k, stride=s, bias=bias), nn.Dropout(0.0), *norm,
                                        nn.GELU()))
            prev = d
        self.conv_layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.conv_layers:
            x = layer(x)
        return x


class _ConvPositions(nn.Module):
    """The relative position embedding: (B, L, D) -> (B, L, D) = GELU(weight-normed grouped conv)."""

    def __init__(self, dim: int, kernel: int, groups: int):
        super().__init__()
        conv = weight_norm(nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=groups), name="weight", dim=2)
        self.pos_conv = nn.Sequential(conv, _DropLast() if kernel % 2 == 0 else nn.Identity(), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pos_conv(x.transpose(1, 2)).transpose(1, 2)


class _SelfAttention(nn.Module):
    """Multi-head self-attention with separate biased q/k/v/out projections, on SDPA."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, D); keys: (B, L) bool, True = may be attended to, or None. -> (B, L, D)."""
        B, L, D = x.shape
        q, k, v = (p(x).view(B, L, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        mask = None if keys is None else keys[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(B, L, D))


class _Layer(nn.Module):
    """A post-LN transformer layer: x = LN(x + MHA(x)); x = LN(x + fc2(GELU(fc1(x))))."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.self_attn = _SelfAttention(dim, heads, dropout)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
        self.final_layer_norm = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        x = self.self_attn_layer_norm(x + self.drop(self.self_attn(x, keys)))
        return self.final_layer_norm(x + self.drop(self.fc2(self.drop(_gelu(self.fc1(x))))))


class _Transformer(nn.Module):
    """LayerNorm, then the layers (ECG-FM is post-LN: the norm comes first, none after)."""

    def __init__(self, dim: int, depth: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.layer_norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(_Layer(dim, heads, ffn, dropout) for _ in range(depth))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        x = self.drop(self.layer_norm(x))
        for layer in self.layers:
            x = layer(x, keys)
        return x


class EcgFmEncoder(SequenceEncoder):
    """ECG-FM's wav2vec 2.0 encoder behind coreecg's `Encoder` interface: (B, C, T) -> Encoded
    over T // patch_size steps (the conv stack's exact length: floor((T - k) / s) + 1 per layer).

    The model reads the 12 standard leads in the order I, II, III, aVR, aVL, aVF, V1-V6 (no lead
    embedding): `lead_idx` places each input row at its lead's channel and leaves the others 0,
    which is what ECG-FM's own preprocessing does to a constant (absent) lead. A short record's
    padding (NaN) is set to 0, its tokens are left out of attention and pooling, as fairseq-signals'
    padding mask does (a token is real when any sample of its stride's share is real).
    """

    def __init__(self, n_leads: int = 12, embed_dim: int = 768, depth: int = 12, num_heads: int = 12,
                 ffn_dim: int = 3072, conv_dims: tuple[int, ...] = (256,) * 4, conv_kernels: tuple[int, ...] = (2,) * 4,
                 conv_strides: tuple[int, ...] = (2,) * 4, conv_bias: bool = False, pos_kernel: int = 128,
                 pos_groups: int = 16, pooling: str = "mean", dropout: float = 0.0):
        super().__init__()
        self.n_leads, self.dim, self.pooling = n_leads, embed_dim, pooling
        self.patch_size = 1
        for s in conv_strides:
            self.patch_size *= s
        self.feature_extractor = _FeatureExtractor(n_leads, tuple(conv_dims), tuple(conv_kernels),
                                                   tuple(conv_strides), conv_bias)
        self.layer_norm = nn.LayerNorm(conv_dims[-1])
        self.post_extract_proj = nn.Linear(conv_dims[-1], embed_dim) if conv_dims[-1] != embed_dim else None
        self.dropout_input = nn.Dropout(dropout)
        self.conv_pos = _ConvPositions(embed_dim, pos_kernel, pos_groups)
        self.encoder = _Transformer(embed_dim, depth, num_heads, ffn_dim, dropout)
        self.source = ""                  # the weights' file, named in errors (set by coreecg.loading)

    @classmethod
    def from_config(cls, config: Config) -> "EcgFmEncoder":
        """From a Config: its input leads (`model.n_leads`) and sizes (`encoders.ecg_fm`)."""
        o = config.encoders.ecg_fm
        return cls(config.model.n_leads, o.embed_dim, o.depth, o.num_heads, o.ffn_dim, tuple(o.conv_dims),
                   tuple(o.conv_kernels), tuple(o.conv_strides), o.conv_bias, o.pos_kernel, o.pos_groups,
                   o.pooling, o.dropout)

    @classmethod
    def _build_for(cls, config, class_names=None, multilabel=None) -> "EcgFmEncoder":
        return cls.from_config(config)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T) with no NaN -> the transformer's input (B, L, D): conv features,
        LayerNorm, projection, plus the convolutional position embedding."""
        if x.shape[-1] < self.patch_size:
            raise ValueError(f"{self.source or 'ECG-FM encoder'}: input of {x.shape[-1]} samples is shorter than "
                             f"one token ({self.patch_size} samples)")
        h = self.layer_norm(self.feature_extractor(x).transpose(1, 2))
        if self.post_extract_proj is not None:
            h = self.post_extract_proj(h)
        h = self.dropout_input(h)
        return h + self.conv_pos(h)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T) with no NaN -> (B, D, L)."""
        return self.encoder(self.embed(x)).transpose(1, 2)

    def forward(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None,
                visible: torch.Tensor | None = None, varying: bool = False) -> Encoded:
        """x: (B, C, T), NaN on a short record's padding -> Encoded(tokens (B, L, D), index, valid
        (B, L) or None, grid (1, L), pad). `visible` is refused (a sequence encoder)."""
        if visible is not None:
            raise ValueError(f"{type(self).__name__} yields a sequence over time and takes no token masks "
                             "(masked modelling needs an encoder with tokens on the (lead, time) grid)")
        pad = None if assumed_unpadded() else torch.isnan(x).any(dim=1)             # (B, T)
        h = self.embed(self.placed(fill(x), lead_idx))                                 # (B, L, D)
        B, L, _ = h.shape
        index = torch.arange(L, device=x.device).expand(B, -1)
        if pad is None or not bool(pad.any()):
            return Encoded(self.encoder(h), index, None, (1, L))
        s, T = self.patch_size, pad.shape[1]
        real = F.pad(~pad, (0, max(0, L * s - T)), value=False)[:, : L * s].reshape(B, L, s).any(dim=2)
        keys = real | (torch.arange(L, device=x.device) == 0)[None, :] & ~real.any(dim=1, keepdim=True)
        # fairseq-signals zeroes padded steps before the transformer and masks them as keys
        tokens = self.encoder(h * real[..., None].to(h.dtype), keys)
        return Encoded(tokens, index, real, (1, L), ~real)

    def pooled(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, T) -> (B, D): "mean" over the real tokens (the pretrained file's embedding), or
        "nonzero": per channel, the sum over real tokens / the count of non-zero entries (the
        fine-tuned file's; a channel with no non-zero entry gives 0 where the original gives NaN)."""
        enc = self.forward(x, lead_idx)
        if self.pooling == "mean":
            return masked_mean(enc.tokens, enc.valid)
        t = enc.tokens if enc.valid is None else enc.tokens * enc.valid[..., None].to(enc.tokens.dtype)
        return t.sum(dim=1) / (t != 0).sum(dim=1).clamp_min(1)


# ---------------------------------------------------------------------------- reading the weights


def unpack(payload: Payload) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A fairseq checkpoint -> (its "model" state dict, its cfg["model"] sizes); a bare state dict
    -> (itself, None). The recorded config: the file's own cfg when it is a plain dict, else the
    `<stem>.yaml` beside it (its "model" section)."""
    entries = payload.entries
    state = entries.get("model", entries)
    recorded = None
    for cfg in (entries.get("cfg"), payload.sidecar):
        if isinstance(cfg, dict) and isinstance(cfg.get("model"), dict):
            recorded = cfg["model"]
            break
    return (state if isinstance(state, dict) else None), recorded


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> the ECG-FM encoder's state (the fine-tuned model's "encoder." prefix
    removed, legacy weight_g / weight_v renamed, everything else dropped), or None when it is not
    ECG-FM's."""
    for prefix in ("", "encoder."):
        sub = {k[len(prefix):]: v for k, v in state.items() if isinstance(k, str) and k.startswith(prefix)}
        if all(k in sub for k in _SIGNATURE):
            return {_LEGACY.get(k, k): v for k, v in sub.items() if _KEEP.match(k)}
    return None


def read_architecture(state: dict[str, torch.Tensor], recorded: dict[str, Any] | None = None) -> Config:
    """The config of an ECG-FM encoder state dict: `model` (arch "ecg_fm", its leads, the whole
    tokens of a 2500-sample window: 2496 input samples) and `encoders.ecg_fm` (its sizes);
    ValueError naming the key for one that is missing or whose shape does not fit the others.
    `recorded`: the checkpoint's cfg["model"] (strides, heads, which pooling)."""
    rec = recorded or {}
    if rec.get("extractor_mode", "default") != "default" or rec.get("layer_norm_first", False):
        raise ValueError(f"recorded extractor_mode={rec.get('extractor_mode')!r}, layer_norm_first="
                         f"{rec.get('layer_norm_first')!r}: only ECG-FM's ('default', False) is supported")
    convs = sorted(int(m.group(1)) for m in map(_CONV.match, state) if m)
    if convs != list(range(len(convs))) or not convs:
        raise ValueError(f"missing key 'feature_extractor.conv_layers.{_first_gap(convs)}.0.weight' "
                         f"(conv layers found: {convs})")
    weights = [_get(state, f"feature_extractor.conv_layers.{i}.0.weight", 3) for i in convs]
    n_leads = int(weights[0].shape[1])
    dims = tuple(int(w.shape[0]) for w in weights)
    kernels = tuple(int(w.shape[2]) for w in weights)
    strides = _strides(rec, dims, kernels)
    dim = int(_get(state, "encoder.layer_norm.weight", 1).shape[0])
    v = _get(state, "conv_pos.pos_conv.0.parametrizations.weight.original1", 3)
    if v.shape[0] != dim or dim % v.shape[1]:
        raise ValueError(f"key 'conv_pos.pos_conv.0.parametrizations.weight.original1' has shape {tuple(v.shape)}, "
                         f"expected ({dim}, {dim} / groups, K) because encoder.layer_norm gives the width {dim}")
    layers = sorted({int(m.group(1)) for m in map(_LAYER.match, state) if m})
    if layers != list(range(len(layers))):
        raise ValueError(f"missing key 'encoder.layers.{_first_gap(layers)}.fc1.weight' (layers found: {layers})")
    ffn = int(_get(state, "encoder.layers.0.fc1.weight", 2).shape[0])
    heads = rec.get("encoder_attention_heads", HEADS)
    heads = heads if isinstance(heads, int) else HEADS
    pooling = "nonzero" if rec.get("_name") in _FINETUNED else "mean"
    try:
        sizes = EcgFmOptions(embed_dim=dim, depth=len(layers), num_heads=heads, ffn_dim=ffn, conv_dims=dims,
                             conv_kernels=kernels, conv_strides=strides,
                             conv_bias="feature_extractor.conv_layers.0.0.bias" in state,
                             pos_kernel=int(v.shape[2]), pos_groups=dim // int(v.shape[1]), pooling=pooling)
        sizes.check()
    except ConfigError as e:
        raise ValueError(f"inconsistent sizes read from the weights and the recorded config: {e}") from None
    # 2500 is no multiple of the 16-sample token: model.input_samples is what the convolutions read of a
    # 2500-sample window (2496 = 156 tokens); the contract still feeds 2500, the last 4 samples unread
    config = Config(model=ModelConfig(arch=NAME, n_leads=n_leads, input_samples=WINDOW // sizes.patch_size
                                      * sizes.patch_size),
                    encoders=EncoderOptions({NAME: sizes}))
    _check_shapes(state, config)
    return config


def _get(state: dict[str, torch.Tensor], key: str, ndim: int) -> torch.Tensor:
    if key not in state:
        raise ValueError(f"missing key {key!r}")
    t = state[key]
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        raise ValueError(f"key {key!r} has shape {tuple(getattr(t, 'shape', ()))}, expected {ndim} dimensions")
    return t


def _first_gap(found: list[int]) -> int:
    return next(i for i in range(len(found) + 1) if i not in found)


def _strides(rec: dict[str, Any], dims: tuple[int, ...], kernels: tuple[int, ...]) -> tuple[int, ...]:
    """The conv strides: the recorded `conv_feature_layers` [(dim, kernel, stride), ...] when it
    matches the weights, else stride = kernel (ECG-FM's layers)."""
    text = rec.get("conv_feature_layers")
    if not isinstance(text, str):
        return kernels
    try:
        layers = _literal(ast.parse(text, mode="eval").body)
        ok = all(isinstance(x, tuple) and len(x) == 3 for x in layers)
    except (SyntaxError, TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"recorded conv_feature_layers {text!r} is not a list of (dim, kernel, stride)")
    if [tuple(x[:2]) for x in layers] != list(zip(dims, kernels)):
        raise ValueError(f"recorded conv_feature_layers {text!r} does not match the weights' (dim, kernel) "
                         f"{list(zip(dims, kernels))}")
    return tuple(int(x[2]) for x in layers)


def _literal(node: ast.AST) -> Any:
    """A list/tuple/int expression with + and * (fairseq's "[(256, 2, 2)] * 4"), evaluated without eval."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
        a, b = _literal(node.left), _literal(node.right)
        if isinstance(node.op, ast.Mult) and max(abs(a) if isinstance(a, int) else 0,
                                                 abs(b) if isinstance(b, int) else 0) > 1000:
            raise ValueError("conv_feature_layers: a repeat count above 1000")     # a file's string: bounded
        return a * b if isinstance(node.op, ast.Mult) else a + b
    raise ValueError(f"conv_feature_layers: unsupported expression {ast.dump(node)[:80]}")


def _check_shapes(state: dict[str, torch.Tensor], config: Config) -> None:
    """Every key the module built from `config` has, with its shape (the module on the meta device)."""
    with torch.device("meta"):
        expected = EcgFmEncoder.from_config(config).state_dict()
    o = config.encoders.ecg_fm
    why = (f"width {o.embed_dim} (encoder.layer_norm), conv widths {list(o.conv_dims)}, ffn {o.ffn_dim} "
           f"(encoder.layers.0.fc1), position kernel {o.pos_kernel} in {o.pos_groups} groups")
    for key, t in expected.items():
        if key not in state:
            raise ValueError(f"missing key {key!r}")
        if tuple(state[key].shape) != tuple(t.shape):
            raise ValueError(f"key {key!r} has shape {tuple(state[key].shape)}, expected {tuple(t.shape)} because "
                             f"of {why}")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise ValueError(f"unexpected key {extra[0]!r} for {why}")


EcgFmEncoder.output_kind = "sequence"
register_encoder(NAME)(EcgFmEncoder)
register(PublishedFamily(
    releases=(
        ('mimic_iv_ecg_physionet_pretrained.pt',
         'Hugging Face wanglab/ecg-fm'),
        ('mimic_iv_ecg_finetuned.pt',
         'Hugging Face wanglab/ecg-fm'),
    ),
    name=NAME, title="ECG-FM (McKeen et al. 2024)", label="ECG-FM", recognise=recognise, unpack=unpack,
    read_architecture=read_architecture, build=EcgFmEncoder.from_config,
    # the closest corpus settings: 500 Hz, 5 s windows, per-lead z-score; ECG-FM filters nothing, and a
    # corpus needs a band, so the widest diagnostic one
    preprocess=PreprocessConfig(sampling_rate=RATE, window_s=5.0, highpass_hz=0.05, lowpass_hz=150.0,
                                zscore_eps=1e-8, standardize="lead"),
    contract=CONTRACT, module="coreecg.model.published.ecg_fm.EcgFmEncoder",
    licence="MIT (weights: HuggingFace wanglab/ecg-fm model card; code: fairseq-signals and ECG-FM, MIT)",
    pooling="pretrained: mean over tokens (the ECG-FM benchmark's); fine-tuned: per channel sum over tokens / "
            "count of non-zero entries (ECG-FM's quickstart)",
    normalisation="z-score per lead over the whole record (std ddof 0, + 1e-8), constant leads 0, no filter",
    pretraining="MIMIC-IV-ECG v1.0 and PhysioNet/CinC 2021 v1.0.3 (PTB-XL, CPSC 2018 and its extra set, Georgia, "
                "Chapman-Shaoxing, Ningbo, INCART, PTB; wav2vec 2.0 + CMSC + random lead masking); "
                "the fine-tuned file further on MIMIC-IV-ECG (17 labels)",
    # CinC 2021 v1.0.3 holds these databases, PTB-XL among them
    pretrained_on=("mimic_iv_ecg", "cinc2021", "ptbxl", "cpsc2018", "cpsc2018_extra", "georgia", "chapman", "ningbo",
                   "incart", "ptb"),
    commercial_use=True,
))
