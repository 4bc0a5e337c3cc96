"""MERL (Liu et al., ICML 2024): its published ECG encoders, read as data and run by coreecg's own code.

MERL pretrains an ECG encoder against the reports of MIMIC-IV-ECG (text tower MedCPT) and releases
the encoder alone as `torch.save(ecg_encoder.state_dict())`: a BARE state dict, no wrapper entry,
no recorded config. Two files: `res18_best_encoder.pth` (a 1-D ResNet18) and
`vit_tiny_best_encoder.pth` (a 1-D ViT-tiny). (The `*_ckpt.pth` whole ECG-text models hold the
encoder under "ecg_encoder."; that prefix is removed, the rest dropped; not checked on a real file.)

ResNet keys (s the stage 1..S, i the block; every convolution bias-free):

    conv1.weight (W1, 12, 7), bn1.*             stem: Conv1d stride 2 padding 3 + BN + ReLU, no max-pool
    layer{s}.{i}.conv{1,2}.weight, bn{1,2}.*   basic block: relu(bn1(conv1)) -> bn2(conv2), + shortcut, relu
        (bottleneck, resnet50/101: conv{1,2,3} 1-3-1, bn{1,2,3}, output 4 x the stage width)
    layer{s}.0.shortcut.{0,1}.*                 1-convolution (stride of the stage) + BN where the shape changes
    linear.*                                    an untrained 10-class head (the class's default): dropped

  3-convolutions have padding 1; stage 1 has stride 1, the others stride 2: T samples give
  L = ceil(T / 2^S) steps (5000 -> 313 for S = 4). Pooled feature: the mean over the steps
  (MERL's AdaptiveAvgPool1d(1)), 512 wide (2048 for a bottleneck).

ViT keys (D width, C leads, P patch size, N patches, K the block index):

    to_patch_embedding.weight (D, C, P)         Conv1d stride P, no bias: one token per P samples of all leads
    pos_embedding (1, N, D)                     added to the patch tokens
    blockK.attn.norm, blockK.attn.fn.to_qkv, blockK.attn.fn.to_out.0     pre-norm attention
    blockK.ff.norm, blockK.ff.fn.net.0, blockK.ff.fn.net.3               pre-norm Linear-GELU-Linear
    norm                                        LayerNorm of the POOLED feature (after the mean)

  Attention: softmax(q k^T / sqrt(dim_head)) v with q, k, v split as (3, heads, dim_head) from one
  biased projection; its inner width heads * dim_head (64 per head in every release) need not be
  the width D. Pooled feature: norm(mean over the N tokens of the last block's output); the
  tokens (forward) are that output before the mean and before the norm.

How the architecture is read: ResNet: leads and stem width from conv1, stage widths from each
stage's first conv1, blocks per stage from the block indices, bottleneck from conv3's presence.
ViT: width, leads and patch size from to_patch_embedding, patches from pos_embedding, depth from
the block keys, MLP width from ff.fn.net.0, attention width from to_qkv; the head count is not in
the weights: a recorded config's "heads" when there is one, else attention width / 64 (MERL's
dim_head for every released size). Every key's shape is then checked against the module those
sizes build.

Traps: (1) the model's rows are MIMIC-IV-ECG's lead order I, II, III, aVR, aVF, aVL, V1-V6 (aVL
and aVF swapped against PTB-XL's); `lead_idx` here indexes that order. (2) One min-max over the
whole (12, 5000) window, not per lead. (3) The ViT's LayerNorm acts after pooling. (4) The ViT's
position table fixes N patches (inputs up to N * P samples, the first positions used); the ResNet
takes any length. (5) BatchNorm: call eval() (the running statistics are the published ones).
(6) A short record's NaN padding is set to 0 after normalisation and left out of the ResNet's mean
(MERL zero-pads CPSC2018 before its min-max and averages over the padding); the ViT's tokens
attend to padding as MERL's do.

No MERL code is used (read to understand it; MIT licence): this module names its parameters as
the published state dicts do, so those load with `load_state_dict` unchanged.
"""
from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config, ModelConfig, PreprocessConfig
from coreecg.config.encoders import EncoderOptions
from coreecg.data.contract import InputContract, Normalise, Window
from coreecg.encoders.build import register_encoder
from coreecg.encoders.published.merl import MerlOptions
from coreecg.model.encoder import masked_mean
from coreecg.model.published.files import Payload
from coreecg.model.published.registry import PublishedFamily, register
from coreecg.model.sequence import SequenceEncoder

NAME = "merl"
HEAD_WIDTH = 64                       # MERL's ViT dim_head (every released size): heads = inner width / 64
WINDOW = 5000                         # 10 s at 500 Hz: MERL's pretraining and downstream window
MODEL_LEADS = ("I", "II", "III", "aVR", "aVF", "aVL", "V1", "V2", "V3", "V4", "V5", "V6")   # MIMIC-IV-ECG order
_PREFIXES = ("", "module.", "ecg_encoder.", "module.ecg_encoder.")
_RESNET_SIGNATURE = ("conv1.weight", "bn1.running_var", "layer1.0.conv1.weight", "layer2.0.shortcut.0.weight")
_VIT_SIGNATURE = ("to_patch_embedding.weight", "pos_embedding", "block0.attn.fn.to_qkv.weight",
                  "block0.ff.fn.net.0.weight", "norm.weight")
_RESNET_KEY = re.compile(r"^(conv1|bn1|layer\d+)\.")
_VIT_KEY = re.compile(r"^(to_patch_embedding\.weight|pos_embedding|norm\.(weight|bias)|block\d+\.)")
_STAGE_BLOCK = re.compile(r"^layer(\d+)\.(\d+)\.conv1\.weight$")
_VIT_BLOCK = re.compile(r"^block(\d+)\.attn\.fn\.to_qkv\.weight$")

# The contract (MERL's finetune/finetune_dataset.py): the first 5000 samples at 500 Hz (a shorter
# record zero-padded first, as its CPSC2018 branch), no filter, one min-max over the whole window;
# the rows picked by name in MIMIC-IV-ECG order (its swap of rows 4 and 5).
CONTRACT = InputContract(
    leads=MODEL_LEADS, sampling_rate=500, window_samples=WINDOW,
    steps=(Window(WINDOW, pad="zero", first=True), Normalise("minmax", axis="record", eps=1e-8, eps_mode="add")),
    layout="channels_first",
    notes="no filter; the first 10 s only; one min and one max over all 12 leads and 5000 samples together "
          "((x - min) / (max - min + 1e-8)); rows in MIMIC-IV-ECG order (aVF before aVL)")
# The closest corpus settings: 500 Hz 10 s windows (coreecg's corpora always band-pass; MERL does not filter)
PREPROCESS = PreprocessConfig(sampling_rate=500, window_s=10.0, highpass_hz=0.05, lowpass_hz=150.0,
                              standardize="record")


class MerlEncoder(SequenceEncoder):
    """MERL's encoders behind coreecg's `Encoder` interface: (B, C, T) rows in MIMIC-IV-ECG lead
    order (`lead_idx` (C,): each row's channel in that order; default the first C) -> Encoded with
    grid (1, L). `from_config` builds the ResNet or the ViT (`encoders.merl.variant`)."""

    source = ""                          # the weights' file, named in errors (set by coreecg.loading)

    @classmethod
    def from_config(cls, config: Config) -> "MerlEncoder":
        o = config.encoders.merl
        if o.variant == "resnet":
            return MerlResNet(config.model.n_leads, o.blocks, o.widths, o.bottleneck)
        return MerlViT(config.model.n_leads, config.model.input_samples // o.patch_size, o.patch_size, o.width,
                       o.depth, o.mlp_dim, o.heads, o.dim_head, o.qkv_bias)


# ---------------------------------------------------------------------------- the ResNet


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv1d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm1d(width)
        self.conv2 = nn.Conv1d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm1d(width)
        self.shortcut = _shortcut(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + self.shortcut(x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv1d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm1d(width)
        self.conv2 = nn.Conv1d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm1d(width)
        self.conv3 = nn.Conv1d(width, 4 * width, 1, bias=False)
        self.bn3 = nn.BatchNorm1d(4 * width)
        self.shortcut = _shortcut(cin, 4 * width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    """Identity (an empty Sequential: no keys) unless the shape changes: 1-conv + BN."""
    if stride == 1 and cin == cout:
        return nn.Sequential()
    return nn.Sequential(nn.Conv1d(cin, cout, 1, stride, bias=False), nn.BatchNorm1d(cout))


class MerlResNet(MerlEncoder):
    """MERL's 1-D ResNet: (B, C, T) -> features (B, widths[-1] * expansion, ceil(T / 2^S))."""

    def __init__(self, n_leads: int = 12, blocks: tuple[int, ...] = (2, 2, 2, 2),
                 widths: tuple[int, ...] = (64, 128, 256, 512), bottleneck: bool = False):
        super().__init__()
        block = _Bottleneck if bottleneck else _Basic
        self.n_leads, self.patch_size = n_leads, 2 ** len(widths)
        self.conv1 = nn.Conv1d(n_leads, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm1d(widths[0])
        cin = widths[0]
        for s, (n, w) in enumerate(zip(blocks, widths)):
            stage = []
            for i in range(n):
                stage.append(block(cin, w, 2 if s > 0 and i == 0 else 1))
                cin = w * block.expansion
            self.add_module(f"layer{s + 1}", nn.Sequential(*stage))
        self.n_stages, self.dim = len(widths), cin

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T) -> (B, D, L): layer S's output (before MERL's average pool)."""
        h = F.relu(self.bn1(self.conv1(x)))
        for s in range(1, self.n_stages + 1):
            h = getattr(self, f"layer{s}")(h)
        return h

    # pooled: SequenceEncoder's mean over the (real) steps = MERL's AdaptiveAvgPool1d(1)


# ---------------------------------------------------------------------------- the ViT


class _PreNorm(nn.Module):
    """x -> fn(LayerNorm(x)); the residual is added by the block."""

    def __init__(self, dim: int, fn: nn.Module):
        super().__init__()
        self.norm, self.fn = nn.LayerNorm(dim), fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x))


class _Attention(nn.Module):
    """Self-attention of `heads` heads of `dim_head`, one fused qkv projection, on SDPA."""

    def __init__(self, dim: int, heads: int, dim_head: int, qkv_bias: bool):
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head, bias=qkv_bias)
        self.to_out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, L, D); the scale is SDPA's default 1 / sqrt(dim_head), as MERL's."""
        B, L, _ = x.shape
        q, k, v = self.to_qkv(x).view(B, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(B, L, -1))


class _FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim),
                                 nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, hidden: int, qkv_bias: bool):
        super().__init__()
        self.attn = _PreNorm(dim, _Attention(dim, heads, dim_head, qkv_bias))
        self.ff = _PreNorm(dim, _FeedForward(dim, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.ff(x)


class MerlViT(MerlEncoder):
    """MERL's 1-D ViT: (B, C, T) -> features (B, D, T // P), the last block's tokens; `pooled` adds
    the final LayerNorm after the mean."""

    def __init__(self, n_leads: int = 12, n_patches: int = 100, patch_size: int = 50, dim: int = 192,
                 depth: int = 12, mlp_dim: int = 768, heads: int = 3, dim_head: int = 64, qkv_bias: bool = True):
        super().__init__()
        self.n_leads, self.n_patches, self.patch_size, self.dim, self.depth = n_leads, n_patches, patch_size, dim, depth
        self.to_patch_embedding = nn.Conv1d(n_leads, dim, patch_size, stride=patch_size, bias=False)
        self.pos_embedding = nn.Parameter(torch.randn(1, n_patches, dim) * 0.02)
        for k in range(depth):
            self.add_module(f"block{k}", _Block(dim, heads, dim_head, mlp_dim, qkv_bias))
        self.norm = nn.LayerNorm(dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T) -> (B, D, n), n = T // P <= n_patches (positions 0..n-1)."""
        n = x.shape[-1] // self.patch_size
        if not 0 < n <= self.n_patches:
            raise ValueError(f"{self.source or 'MERL ViT'}: input of {x.shape[-1]} samples is {n} patches of "
                             f"{self.patch_size}; its position table covers 1..{self.n_patches} patches "
                             f"({self.n_patches * self.patch_size} samples)")
        h = self.to_patch_embedding(x).transpose(1, 2) + self.pos_embedding[:, :n]           # (B, n, D)
        for k in range(self.depth):
            h = getattr(self, f"block{k}")(h)
        return h.transpose(1, 2)

    def pooled(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """MERL's feature: (B, C, T) -> (B, D), LayerNorm of the mean over the (real) tokens."""
        enc = self.forward(x, lead_idx)
        return self.norm(masked_mean(enc.tokens, enc.valid))


# ---------------------------------------------------------------------------- reading the weights


def unpack(payload: Payload) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """MERL's files are bare state dicts (no recorded config); a "state_dict" or "model" entry,
    as a re-saved copy may hold, is taken instead. -> (candidate state, None)."""
    entries = payload.entries
    for key in ("state_dict", "model"):
        if isinstance(entries.get(key), dict):
            return entries[key], None
    return entries, None


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> MERL's encoder state (a "module." / "ecg_encoder." prefix removed; the
    ResNet's "linear." head, a ViT "head." and any other entry dropped), or None when neither
    network's signature keys are there."""
    for prefix in _PREFIXES:
        sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if _has(sub, _RESNET_SIGNATURE) and sub["conv1.weight"].ndim == 3:
            kept = {k: v for k, v in sub.items() if _RESNET_KEY.match(k)}
            # torch's own rule for files saved before BatchNorm had the counter: 0
            for k in [k for k in kept if k.endswith(".running_mean")]:
                kept.setdefault(k[: -len("running_mean")] + "num_batches_tracked", torch.tensor(0))
            return kept
        if _has(sub, _VIT_SIGNATURE) and sub["to_patch_embedding.weight"].ndim == 3:
            return {k: v for k, v in sub.items() if _VIT_KEY.match(k)}
    return None


def _has(state: dict[str, Any], keys: tuple[str, ...]) -> bool:
    return all(isinstance(state.get(k), torch.Tensor) for k in keys)


def read_architecture(state: dict[str, torch.Tensor], recorded: dict[str, Any] | None = None) -> Config:
    """The config of a recognised MERL state (model: arch "merl", leads, input samples;
    encoders.merl: the sizes); ValueError naming the key for a state whose keys and shapes do not
    fit together. `recorded`: a config with "heads" (the ViT's head count), if any."""
    if "conv1.weight" in state:
        stem = _need(state, "conv1.weight")
        if stem.ndim != 3:
            raise ValueError(f"key 'conv1.weight' has shape {tuple(stem.shape)}, expected (width, leads, 7): "
                             "MERL's ResNet stem is a Conv1d")
        n_leads, samples = int(stem.shape[1]), WINDOW
        stages = _indices(state, _STAGE_BLOCK)
        if not stages or sorted(stages) != list(range(1, len(stages) + 1)):
            raise ValueError(f"missing key 'layer{len(stages) + 1 if stages else 1}.0.conv1.weight': stages "
                             f"{sorted(stages)} are not 1..S")
        blocks = tuple(_count(stages[s], f"layer{s}.{{}}.conv1.weight") for s in sorted(stages))
        widths = tuple(int(state[f"layer{s}.0.conv1.weight"].shape[0]) for s in sorted(stages))
        sizes = MerlOptions(variant="resnet", blocks=blocks, widths=widths,
                            bottleneck="layer1.0.conv3.weight" in state)
        why = f"MERL's ResNet with {n_leads} leads, widths {list(widths)}, blocks {list(blocks)}, " \
              f"{'bottleneck' if sizes.bottleneck else 'basic'} blocks (read from conv1 and each stage's first conv1)"
    else:
        pe = _need(state, "to_patch_embedding.weight")
        pos = _need(state, "pos_embedding")
        if pe.ndim != 3:
            raise ValueError(f"key 'to_patch_embedding.weight' has shape {tuple(pe.shape)}, expected "
                             "(width, leads, patch): MERL's ViT patches with a Conv1d")
        dim, n_leads, patch = (int(s) for s in pe.shape)
        if pos.ndim != 3 or pos.shape[0] != 1 or pos.shape[2] != dim:
            raise ValueError(f"key 'pos_embedding' has shape {tuple(pos.shape)}, expected (1, patches, {dim}) "
                             f"because to_patch_embedding.weight gives width {dim}")
        depth = len(_indices(state, _VIT_BLOCK))
        _count(_indices(state, _VIT_BLOCK), "block{}.attn.fn.to_qkv.weight")
        qkv = _need(state, "block0.attn.fn.to_qkv.weight")
        inner, hidden = int(qkv.shape[0]) // 3, int(_need(state, "block0.ff.fn.net.0.weight").shape[0])
        heads = (recorded or {}).get("heads")
        if not (isinstance(heads, int) and heads > 0):
            if inner % HEAD_WIDTH:
                raise ValueError(f"key 'block0.attn.fn.to_qkv.weight' has shape {tuple(qkv.shape)}: attention "
                                 f"width {inner} is no multiple of MERL's head width {HEAD_WIDTH}, and no recorded "
                                 "'heads' says how many heads it has")
            heads = inner // HEAD_WIDTH
        if qkv.shape[0] % 3 or inner % heads:
            raise ValueError(f"key 'block0.attn.fn.to_qkv.weight' has shape {tuple(qkv.shape)}, expected "
                             f"(3 * heads * dim_head, {dim}) with {heads} heads")
        samples = int(pos.shape[1]) * patch
        sizes = MerlOptions(variant="vit", patch_size=patch, width=dim, depth=depth, mlp_dim=hidden, heads=heads,
                            dim_head=inner // heads, qkv_bias="block0.attn.fn.to_qkv.bias" in state)
        why = f"MERL's ViT of width {dim}, {n_leads} leads, patch {patch}, depth {depth}, MLP {hidden}, " \
              f"attention {heads} x {inner // heads} (read from to_patch_embedding, pos_embedding and block0)"
    config = Config(model=ModelConfig(arch=NAME, n_leads=n_leads, input_samples=samples),
                    encoders=EncoderOptions({NAME: sizes}))
    _check_shapes(state, config, why)
    return config


def _need(state: dict[str, Any], key: str) -> torch.Tensor:
    if not isinstance(state.get(key), torch.Tensor):
        raise ValueError(f"missing key {key!r}")
    return state[key]


def _indices(state: dict[str, Any], pattern: re.Pattern) -> dict[int, set[int]]:
    """Keys matching `pattern` (1 or 2 groups) -> {first group: {second group}}."""
    out: dict[int, set[int]] = {}
    for k in state:
        m = pattern.match(k)
        if m:
            out.setdefault(int(m.group(1)), set()).update(int(g) for g in m.groups()[1:])
    return out


def _count(found, template: str) -> int:
    """How many of 0, 1, ... `found` holds; ValueError naming the first gap's key."""
    n = len(found)
    gap = next((i for i in range(n) if i not in found), None)
    if gap is not None:
        raise ValueError(f"missing key {template.format(gap)!r}")
    return n


def _check_shapes(state: dict[str, Any], config: Config, why: str) -> None:
    """Every key of the module `config` builds is in `state` with its shape, and nothing else."""
    with torch.device("meta"):
        expected = MerlEncoder.from_config(config).state_dict()
    for key, ref in expected.items():
        if key not in state:
            raise ValueError(f"missing key {key!r} ({why})")
        if tuple(state[key].shape) != tuple(ref.shape):
            raise ValueError(f"key {key!r} has shape {tuple(state[key].shape)}, expected {tuple(ref.shape)} "
                             f"because this is {why}")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise ValueError(f"unexpected key {extra[0]!r} ({len(extra)} in all) for {why}")


MerlEncoder.output_kind = "sequence"
register_encoder(NAME)(MerlEncoder)
_DRIVE = ("MERL's Google Drive folder (github.com/cheliu-computation/MERL-ICML2024 README: "
          "drive.google.com/drive/folders/13wb4DppUciMn-Y_qC2JRWTbZdz3xX0w2)")
register(PublishedFamily(
    releases=(
        ('res18_best_encoder.pth',
         _DRIVE),
        ('vit_tiny_best_encoder.pth',
         _DRIVE),
    ),
    name=NAME, title="MERL (Liu et al., ICML 2024)", label="MERL", recognise=recognise, unpack=unpack,
    read_architecture=read_architecture, build=MerlEncoder.from_config, preprocess=PREPROCESS, contract=CONTRACT,
    module="coreecg.model.published.merl.MerlEncoder",
    licence="code MIT (cheliu-computation/MERL-ICML2024); the weights (Google Drive) state no licence",
    pooling="ResNet: the mean over time of the last stage (AdaptiveAvgPool1d); ViT: the final LayerNorm of the "
            "mean over the last block's tokens",
    normalisation="one min-max to [0, 1] over the whole (12, 5000) window (+1e-8), no filter",
    pretraining="MIMIC-IV-ECG v1.0 (about 800,000 12-lead 10 s ECGs with their machine reports), ECG-report "
                "contrastive pretraining",
    pretrained_on=("mimic_iv_ecg",), commercial_use=False,
))
