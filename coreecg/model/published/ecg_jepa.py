"""ECG-JEPA (Kim 2024): its published context encoder, read as data and run by coreecg's own code.

ECG-JEPA publishes two checkpoints (multi-block and random masking), both `torch.save` dicts:

    {"encoder": the MaskTransformer (context encoder) state dict, "epoch": int}

no target encoder, no predictor, no optimiser and no recorded config. A state dict of the whole
pretraining model (`encoder.`, `target_encoder.`, `predictor.`) is read too: its `encoder.` part.

Keys of the encoder (D width, P samples per token, R = 8 leads x N patches, K the block index):

    pos_embed (R, D)                        fixed 2-D sin-cos table (a frozen Parameter in ECG-JEPA),
                                            row lead * N + patch
    W_P (weight (D, P), bias)               the token embedding: Linear(P, D) of each patch
    encoder_blocks.blocks.K.norm1, .norm2   pre-norm LayerNorms
    encoder_blocks.blocks.K.attn.qkv        Linear(D, 3D), no bias in the published files
    encoder_blocks.blocks.K.attn.proj       Linear(D, D)
    encoder_blocks.blocks.K.mlp.fc1, .fc2   Linear(D, 4D), GELU (exact), Linear(4D, D)
    norm                                    the final LayerNorm, applied to every token

The computation (ECG-JEPA's `MaskTransformer.representation`, checked against the original's
output in tests/test_published_ecg_jepa.py): each lead's 2,500 samples are cut into 50 patches
of 50, all 8 x 50 tokens form one sequence, embedded by W_P. Attention is restricted: token i
attends token j only when they share the lead or the patch index (the original's
`_cross_attention_mask`). The position table is added to the input of EVERY block (`x =
block(x + pos)`, so it accumulates in the residual stream), not once. The final LayerNorm is
applied per token; the pooled feature is the mean of the 400 normalised tokens.

The architecture is read from the state dict: width and samples per token from W_P, patches per
lead from pos_embed (rows / 8: the lead count is ECG-JEPA's fixed 8, I, II, V1-V6), depth from the
block keys, the MLP width from fc1, the qkv bias from its presence. The head count is not in the
weights: a recorded config's "num_heads" / "encoder_num_heads" when there is one, else 16 (what
ECG-JEPA's `load_encoder` hard-codes for both published files).

Traps: the lead order is I, II, V1-V6 (the 12-lead array without III, aVR, aVL, aVF), not the
standard order's first 8; `pos_embed` is loaded from the file, never recomputed (in the published
files it equals the sin-cos table, whose patch index comes FIRST despite the original's `emb_h`
name); input in millivolts, neither filtered nor normalised.

Lead subsets: `lead_idx` names each input row's standard lead (I, II, III, aVR, aVL, aVF, V1-V6
order, as coreecg's Encoder); each row takes its lead's rows of the position table, and attention
stays within a row or a patch index (the original's `restrict_leads`). A lead the model does not
know (III, aVR, aVL, aVF) is a ValueError. lead_idx None: 8 rows are the model's leads in its
order (model_input.npy's layout); fewer rows are its first leads.

No ECG-JEPA code is used (its code is MIT; the weights state no licence): this module names its
parameters as the published state dict does, so that loads with `load_state_dict` unchanged.
"""
from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config, ModelConfig, PreprocessConfig
from coreecg.config.base import STANDARD_LEADS
from coreecg.config.encoders import EncoderOptions
from coreecg.data.contract import InputContract, Resample, Window
from coreecg.encoders.build import register_encoder
from coreecg.encoders.published.ecg_jepa import EcgJepaOptions
from coreecg.model.encoder import Encoded, masked_mean
from coreecg.model.padding import assumed_unpadded, fill, padding_mask
from coreecg.model.published.registry import PublishedFamily, register

NAME = "ecg_jepa"
LEADS = ("I", "II", "V1", "V2", "V3", "V4", "V5", "V6")     # the model's rows, in its order
HEADS = 16                 # ECG-JEPA's encoder_num_heads (models.load_encoder); not in the weights
_PREFIX = "encoder_blocks.blocks."
_BLOCK_KEY = re.compile(r"^encoder_blocks\.blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)"
                        r"\.(weight|bias)$")
_TOP_KEYS = ("pos_embed", "W_P.weight", "W_P.bias", "norm.weight", "norm.bias")
_SIGNATURE = ("pos_embed", "W_P.weight", "encoder_blocks.blocks.0.attn.qkv.weight")

# ECG-JEPA's downstream input (ecg_data.waves_ptbxl): the whole 500 Hz record FFT-resampled to 250
# Hz (scipy.signal.resample, 5,000 -> 2,500 for PTB-XL's 10 s), the 8 leads, millivolts as read.
CONTRACT = InputContract(
    leads=LEADS, sampling_rate=250, window_samples=2500,
    steps=(Resample(rate=250, method="fft", length="floor"), Window(2500, first=True)),
    layout="channels_first",
    notes="leads I, II, V1-V6 in that order (the 12-lead array without III, aVR, aVL, aVF); the whole record is "
          "FFT-resampled (scipy.signal.resample) before the first 10 s are kept; no filter and no normalisation "
          "(millivolts as read); exactly 2,500 samples per lead (the original asserts it). ECG-JEPA's CPSC reader "
          "instead keeps the first 10 s at 500 Hz and then resamples (the same on a 10 s record).")

# The closest standard corpus settings: 250 Hz, 10 s windows of the model's 8 leads. ECG-JEPA's
# input is neither filtered nor normalised, which a coreecg corpus cannot express (it always
# band-passes and z-scores): the widest band it takes and a record-wide z-score (which keeps the
# leads' relative amplitudes); CONTRACT is the exact pipeline.
PREPROCESS = PreprocessConfig(sampling_rate=250, window_s=10.0, highpass_hz=0.05, lowpass_hz=100.0, leads=LEADS,
                              standardize="record")


def sincos_table(dim: int, n_leads: int, n_patches: int) -> torch.Tensor:
    """ECG-JEPA's 2-D sin-cos position table (R = n_leads * n_patches, dim) float32, row lead *
    n_patches + patch: [sin(patch w), cos(patch w), sin(lead w), cos(lead w)], each dim / 4 wide,
    w_k = 10000 ** (-k / (dim / 4)); computed in float64 as the original (numpy), on the host (also
    under a meta default device: a table of data, not of the sizes)."""
    quarter = dim // 4
    f64 = {"dtype": torch.float64, "device": "cpu"}
    omega = 1.0 / 10000 ** (torch.arange(quarter, **f64) / quarter)
    patch = torch.arange(n_patches, **f64)[None, :].expand(n_leads, -1).reshape(-1, 1) * omega
    lead = torch.arange(n_leads, **f64)[:, None].expand(-1, n_patches).reshape(-1, 1) * omega
    return torch.cat([patch.sin(), patch.cos(), lead.sin(), lead.cos()], dim=1).float()


class _Attention(nn.Module):
    """Multi-head self-attention, fused qkv (bias optional), on SDPA (scale 1/sqrt(head width))."""

    def __init__(self, dim: int, heads: int, qkv_bias: bool, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """x: (B, L, D); attn_mask: (B or 1, 1, L, L) bool, True = may attend. -> (B, L, D)."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, L, D)))


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class _Block(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, dim: int, heads: int, hidden: int, qkv_bias: bool, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads, qkv_bias, dropout)
        self.mlp = _Mlp(dim, hidden, dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attn_mask)
        return x + self.mlp(self.norm2(x))


class _Blocks(nn.Module):
    """The block stack (ECG-JEPA's Encoder_Block): the position table enters every block."""

    def __init__(self, dim: int, depth: int, heads: int, hidden: int, qkv_bias: bool, dropout: float):
        super().__init__()
        self.blocks = nn.ModuleList(_Block(dim, heads, hidden, qkv_bias, dropout) for _ in range(depth))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """x: (B, L, D); pos: (B or 1, L, D); attn_mask: (B or 1, 1, L, L) -> (B, L, D)."""
        for block in self.blocks:
            x = block(x + pos, attn_mask)
        return x


class EcgJepaEncoder(nn.Module):
    """ECG-JEPA's context encoder behind coreecg's `Encoder` interface (`pooled`, `forward` ->
    Encoded): tokens on the (lead, time) grid, so it takes `visible` token masks.

    Inputs of up to `n_patches * patch_size` samples (2,500: a trailing remainder of a patch is
    cut; fewer patches take the table's first positions, as the original's masked forward keeps
    each token's position); a short record's padding (NaN, coreecg.model.padding) is never
    attended to and pools out.
    """

    def __init__(self, n_leads: int = 8, n_patches: int = 50, patch_size: int = 50, dim: int = 768,
                 depth: int = 12, num_heads: int = HEADS, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                 dropout: float = 0.0):
        super().__init__()
        if n_leads != len(LEADS):
            raise ValueError(f"ECG-JEPA's encoder has {len(LEADS)} leads ({', '.join(LEADS)}), got n_leads={n_leads}")
        self.n_leads, self.n_patches, self.patch_size, self.dim, self.depth = n_leads, n_patches, patch_size, dim, depth
        self.W_P = nn.Linear(patch_size, dim)
        # a fixed table in ECG-JEPA (requires_grad=False): a buffer here, under the same key
        self.register_buffer("pos_embed", sincos_table(dim, n_leads, n_patches))
        self.encoder_blocks = _Blocks(dim, depth, num_heads, int(round(dim * mlp_ratio)), qkv_bias, dropout)
        self.norm = nn.LayerNorm(dim)
        slot = torch.full((len(STANDARD_LEADS),), -1, dtype=torch.long)
        slot[[STANDARD_LEADS.index(x) for x in LEADS]] = torch.arange(n_leads)
        self.register_buffer("_slot", slot, persistent=False)      # standard position -> model row
        self.source = ""                  # the weights' file, named in errors (set by coreecg.loading)
        self._init_weights()

    def _init_weights(self) -> None:
        """ECG-JEPA's initialisation (for a module not loaded from weights): truncated normal 0.02,
        zero biases, each block's output projections divided by sqrt(2 * (index + 1))."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        with torch.no_grad():
            for k, block in enumerate(self.encoder_blocks.blocks):
                block.attn.proj.weight.div_(math.sqrt(2.0 * (k + 1)))
                block.mlp.fc2.weight.div_(math.sqrt(2.0 * (k + 1)))

    @classmethod
    def from_config(cls, config: Config) -> "EcgJepaEncoder":
        """From a Config: its input (`model`) and sizes (`encoders.ecg_jepa`, read from the weights)."""
        o = config.encoders.ecg_jepa
        return cls(config.model.n_leads, config.n_patches, o.patch_size, o.embed_dim, o.depth, o.num_heads,
                   o.mlp_ratio, o.qkv_bias, o.dropout)

    # ------------------------------------------------------------------ the grid

    def _rows(self, C: int, lead_idx: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """(C,) the model row (0..7) of each input row; ValueError for a lead it does not know."""
        if lead_idx is None:
            if C > self.n_leads:
                raise ValueError(f"{self.source or 'ECG-JEPA encoder'}: {C} input leads, the model knows "
                                 f"{self.n_leads} ({', '.join(LEADS)})")
            return torch.arange(C, device=device)
        if lead_idx.numel() != C:
            raise ValueError(f"{self.source or 'ECG-JEPA encoder'}: lead_idx names {lead_idx.numel()} leads for "
                             f"{C} input rows")
        rows = self._slot.to(device)[lead_idx.to(device)]
        if bool((rows < 0).any()):
            names = [STANDARD_LEADS[i] for i in lead_idx.tolist() if STANDARD_LEADS[i] not in LEADS]
            raise ValueError(f"{self.source or 'ECG-JEPA encoder'}: lead(s) {names} are not ECG-JEPA's; it knows "
                             f"{', '.join(LEADS)}")
        return rows

    def _embed(self, x: torch.Tensor, lead_idx: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, C, T), NaN-free -> tokens (B, C * n, D) after W_P and their positions (C * n, D)."""
        B, C, T = x.shape
        n = T // self.patch_size
        if n > self.n_patches or n == 0:
            raise ValueError(f"{self.source or 'ECG-JEPA encoder'}: input of {T} samples is {n} patches of "
                             f"{self.patch_size}; this encoder's position table covers 1..{self.n_patches} patches "
                             f"({self.n_patches * self.patch_size} samples)")
        rows = self._rows(C, lead_idx, x.device)
        t = self.W_P(x[..., : n * self.patch_size].reshape(B, C * n, self.patch_size))
        pos = self.pos_embed.view(self.n_leads, self.n_patches, self.dim)[rows, :n].reshape(C * n, self.dim)
        return t, pos.to(t.dtype)

    def forward(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None,
                visible: torch.Tensor | None = None, varying: bool = False) -> Encoded:
        """x: (B, C, T), NaN on a short record's padding; visible: (B, C, n) bool or None (= every
        token). -> Encoded: each token's encoding (the final LayerNorm applied per token) on the
        (C, n) grid, index c * n + patch.

        With `visible`, only visible tokens enter the transformer (as the original's masked
        forward: each keeps its position and the same-lead-or-same-patch rule), padded to the
        batch maximum, the padding masked out of attention. `varying` is accepted for the
        methods' calls (the mask is always built).
        """
        pad = None if assumed_unpadded() else padding_mask(x, self.patch_size)
        if pad is not None and not bool(pad.any()):
            pad = None
        t, pos = self._embed(fill(x), lead_idx)
        B, L, D = t.shape
        C = x.shape[1]
        n = L // C
        flat_pad = None if pad is None else pad.reshape(B, L)
        if visible is None:
            index = torch.arange(L, device=x.device).expand(B, -1)
            valid = None if flat_pad is None else ~flat_pad
            out = self.encoder_blocks(t, pos[None], _attention_mask(index, n, valid))
            return Encoded(self.norm(out), index, valid, (C, n), flat_pad)
        keep = visible.to(x.device).reshape(B, L)
        if flat_pad is not None:
            keep = keep & ~flat_pad           # a short record's padding is never a visible token
        counts = keep.sum(1)
        longest = int(counts.max())
        index = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :longest]   # visible first, grid order
        valid = torch.arange(longest, device=x.device)[None, :] < counts[:, None]
        valid = None if bool(valid.all()) else valid
        gathered = torch.gather(t, 1, index[..., None].expand(-1, -1, D))
        out = self.encoder_blocks(gathered, pos[index], _attention_mask(index, n, valid))
        return Encoded(self.norm(out), index, valid, (C, n), flat_pad)

    def pooled(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """ECG-JEPA's feature (`representation`): (B, C, T) -> (B, D), the mean of the final
        LayerNorm's tokens (of the real ones, for a short record)."""
        enc = self.forward(x, lead_idx)
        return masked_mean(enc.tokens, enc.valid)


def _attention_mask(index: torch.Tensor, n: int, valid: torch.Tensor | None) -> torch.Tensor:
    """index: (B, L) grid positions c * n + patch; valid: (B, L) or None -> (B, 1, L, L) bool:
    query i may attend key j when they share the input row or the patch index (ECG-JEPA's cross
    attention mask) and j is valid; every token attends itself, so a padding query's softmax has
    a key (its output is discarded)."""
    row, patch = index // n, index % n
    allowed = (row[:, :, None] == row[:, None, :]) | (patch[:, :, None] == patch[:, None, :])
    if valid is not None:
        eye = torch.eye(index.shape[1], dtype=torch.bool, device=index.device)
        allowed = (allowed & valid[:, None, :]) | eye
    return allowed[:, None]


# ---------------------------------------------------------------------------- reading the weights


def unpack(payload: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A `files.Payload` -> (its "encoder" entry, or the entries themselves for a bare state dict;
    its "config" entry if a dict, else None: the published files record none)."""
    entries = payload.entries
    state = entries.get("encoder", entries)
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        return None, None
    recorded = entries.get("config") if isinstance(entries.get("config"), dict) else None
    return state, recorded


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> the encoder's state (a whole model's "encoder." prefix removed, every other
    key dropped: target encoder, predictor, anything else), or None when it is not ECG-JEPA's."""
    for prefix in ("", "encoder."):
        sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if all(k in sub for k in _SIGNATURE):
            return {k: v for k, v in sub.items() if k in _TOP_KEYS or _BLOCK_KEY.match(k)}
    return None


def _shape(state: dict[str, Any], key: str) -> tuple[int, ...]:
    if key not in state:
        raise ValueError(f"ECG-JEPA encoder state: missing key {key!r}")
    return tuple(int(s) for s in state[key].shape)


def read_architecture(state: dict[str, Any], recorded: dict[str, Any] | None = None) -> Config:
    """The config of an ECG-JEPA encoder state dict: `model` (arch "ecg_jepa", 8 leads, input
    samples = patches x samples per token) and `encoders.ecg_jepa` (its sizes). ValueError naming
    the key for a missing key or a shape that does not fit. `recorded`: a config entry (heads)."""
    wp = _shape(state, "W_P.weight")
    if len(wp) != 2:
        raise ValueError(f"key 'W_P.weight' has shape {wp}, expected (width, samples per token)")
    dim, patch = wp
    rows = _shape(state, "pos_embed")
    if len(rows) != 2 or rows[1] != dim or rows[0] % len(LEADS) or rows[0] == 0:
        raise ValueError(f"key 'pos_embed' has shape {rows}, expected ({len(LEADS)} x patches, {dim}) because "
                         f"W_P.weight gives the width {dim} and ECG-JEPA has {len(LEADS)} leads")
    n_patches = rows[0] // len(LEADS)
    depth = 1 + max((int(m.group(1)) for m in map(_BLOCK_KEY.match, state) if m), default=-1)
    if depth == 0:
        raise ValueError(f"ECG-JEPA encoder state: missing key '{_PREFIX}0.attn.qkv.weight' (no blocks)")
    hidden = _shape(state, f"{_PREFIX}0.mlp.fc1.weight")[0]
    qkv_bias = f"{_PREFIX}0.attn.qkv.bias" in state
    why = f"the width is {dim} (W_P.weight), the MLP width {hidden} ({_PREFIX}0.mlp.fc1.weight)"
    expected = {"W_P.bias": (dim,), "norm.weight": (dim,), "norm.bias": (dim,)}
    for k in range(depth):
        b = f"{_PREFIX}{k}."
        expected.update({b + "norm1.weight": (dim,), b + "norm1.bias": (dim,), b + "norm2.weight": (dim,),
                         b + "norm2.bias": (dim,), b + "attn.qkv.weight": (3 * dim, dim),
                         b + "attn.proj.weight": (dim, dim), b + "attn.proj.bias": (dim,),
                         b + "mlp.fc1.weight": (hidden, dim), b + "mlp.fc1.bias": (hidden,),
                         b + "mlp.fc2.weight": (dim, hidden), b + "mlp.fc2.bias": (dim,)})
        if qkv_bias:
            expected[b + "attn.qkv.bias"] = (3 * dim,)
    for key, want in expected.items():
        got = _shape(state, key)
        if got != want:
            raise ValueError(f"key {key!r} has shape {got}, expected {want} because {why}")
    rec = recorded or {}
    heads = rec.get("num_heads", rec.get("encoder_num_heads"))
    heads = int(heads) if isinstance(heads, int) and heads > 0 else HEADS
    if dim % heads or dim % 4:
        raise ValueError(f"width {dim} (W_P.weight) is not divisible by {heads} heads "
                         f"({'recorded' if heads != HEADS else 'ECG-JEPA: not in the weights'}) and by 4 "
                         "(the sin-cos table)")
    sizes = EcgJepaOptions(patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=hidden / dim,
                           qkv_bias=qkv_bias)
    return Config(model=ModelConfig(arch=NAME, n_leads=len(LEADS), input_samples=n_patches * patch),
                  encoders=EncoderOptions({NAME: sizes}))


EcgJepaEncoder.output_kind = "grid"
register_encoder(NAME)(EcgJepaEncoder)
register(PublishedFamily(
    releases=(
        ('multiblock_epoch100.pth',
         'ECG-JEPA\'s Google Drive link (github.com/sehunfromdaegu/ECG_JEPA README, "Pretrained Checkpoints")'),
    ),
    name=NAME, title="ECG-JEPA (Kim 2024)", label="ECG-JEPA", recognise=recognise, unpack=unpack,
    read_architecture=read_architecture, build=EcgJepaEncoder.from_config, preprocess=PREPROCESS,
    contract=CONTRACT, module="coreecg.model.published.ecg_jepa.EcgJepaEncoder",
    licence="code MIT (sehunfromdaegu/ECG_JEPA); the weights (Google Drive) state no licence of their own",
    pooling="mean of the 400 tokens after the final LayerNorm (MaskTransformer.representation)",
    normalisation="none: millivolts as read, no filter",
    pretraining="Chapman-Shaoxing and Ningbo (PhysioNet's ecg-arrhythmia WFDB records, 1.0.0) and CODE-15 "
                "(pretrain_ECG_JEPA.py); PTB-XL is only the downstream evaluation",
    pretrained_on=("chapman", "ningbo", "code15"),
    commercial_use=False,
))
