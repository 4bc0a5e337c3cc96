"""ECGFM-KED (Tian et al., Cell Reports Medicine 2024): its published ECG encoder, read as data and
run by coreecg's own code.

The release (Zenodo 14881564) is `best_valid_all_increase_with_augment_epoch_3.pt`, the `torch.save`
dict main_mimiciv.py writes when the validation AUC improves:

    ecg_model       the xresnet1d101 backbone's state dict (keys without prefix: "0.0.weight", ...)
    model           the TQN query decoder (decoder.layers.*, decoder.norm.*, decoder_norm.*, mlp_head.*)
    text_encoder    the Bio_ClinicalBERT text tower (bert_model.*, mlp_embed.*, logit_scale)
    optimizer, lr_scheduler, config (the training yaml as a dict), epoch

Only `ecg_model` is kept (a flat file with "ecg_model."-prefixed keys, or a bare backbone state
dict, is read too); the text tower, the decoder and any classification head are dropped by name.

Keys of the backbone (an nn.Sequential; S stem convolutions, here 3; stage i = S + 1 + s):

    {0..S-1}.0.weight (c_out, c_in, k), {0..S-1}.1.*    stem Conv1d (stride 2 in the first) + BatchNorm (+ ReLU)
    S                                                 MaxPool1d(3, 2, 1), no keys
    i.b.convs.{0,1,2}.{0.weight,1.*}                  bottleneck block b: 1x1 -> k (stride) -> 1x1 conv-BN,
                                                      ReLU after the first two only
    i.b.convpath.0.{0,1,2}.*                          the SAME tensors again: the block registers its
                                                      convolutions as `convs` and wraps them in `convpath`
    i.b.idpath.{0|1}.{0.weight,1.*}                   the shortcut's 1x1 conv-BN where the width changes:
                                                      idpath.1 behind an AvgPool1d(2, ceil_mode=True) in a
                                                      strided block, idpath.0 otherwise; none when in == out

The computation: block(x) = ReLU(convpath(x) + idpath(x)), the first block of every stage but the
first of stride 2 (in its middle convolution; the shortcut average-pools, the last window of an odd
length being the one remaining sample); all convolutions bias-free with padding (k - 1) // 2. The
output is (B, 4 w, L) with L = ceil(T / 32) for four stages (1000 samples -> 32 steps).
ECGFM-KED's embedding is its mean over time (`ecg_features.mean(-1)` in engine/train_fg.py); the
tokens are the steps (what its query decoder reads, `ecg_features.transpose(1, 2)`).

The architecture is read from the state dict: leads and stem widths from the stem convolutions,
the stages and their block counts from the keys, each stage's width from its first 1x1
convolution, the kernels from the weights' last axis. Every expected key is then checked by name
and shape (a module built on the meta device), and each `convs` tensor against its `convpath`
twin. Nothing is read from the recorded config: it names no backbone size.

The traps: a loader that looks for "ecg_model."-prefixed TOP-level keys (and loads strict=False)
loads nothing from this nested file, and a randomly initialised encoder results; the stage widths
are ECGFM-KED's (64, 128, 128, 192), not the PTB-XL benchmark's (64, 128, 256, 512); the model
takes 100 Hz input (ecg-fm-benchmarking feeds it 500 Hz); pretraining read MIMIC-IV-ECG in its
stored lead order (aVF before aVL) while every downstream script feeds the canonical order.

No ECGFM-KED code is used (its repository has no licence): this module names its parameters as
the published state dict does, so it loads with `load_state_dict` unchanged.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from coreecg.config import Config, ConfigError, ModelConfig, PreprocessConfig
from coreecg.config.encoders import EncoderOptions
from coreecg.data.contract import InputContract, NanTo, Resample, Window
from coreecg.encoders.build import register_encoder
from coreecg.encoders.published.ecgfm_ked import EXPANSION, EcgFmKedOptions
from coreecg.model.published.files import Payload
from coreecg.model.published.registry import PublishedFamily, register
from coreecg.model.sequence import SequenceEncoder
from coreecg.model.xresnet1d import conv_bn

NAME = "ecgfm_ked"
RATE, WINDOW = 100, 1000                 # 10 s at 100 Hz, the pretraining input
LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
_BN = r"(?:weight|bias|running_mean|running_var|num_batches_tracked)"
_STEM = re.compile(rf"^(\d+)\.(?:0\.weight|1\.{_BN})$")
_BLOCK = re.compile(rf"^(\d+)\.(\d+)\.(?:convs\.\d+|convpath\.0\.\d+|idpath\.\d+)\.(?:0\.weight|1\.{_BN})$")
_SIGNATURE = ("0.0.weight", "0.1.running_var", "4.0.convs.0.0.weight", "4.0.convpath.0.0.0.weight")
_PREFIXES = ("", "ecg_model.", "module.", "ecg_model.module.")

# MimicivDataset.__getitem__ (dataset/ecgDataset.py): scipy.signal.resample to int(N / 5) samples,
# then NaN -> 0 (after the FFT, so one NaN empties its whole lead); no filter, no normalisation.
CONTRACT = InputContract(
    leads=LEADS, sampling_rate=RATE, window_samples=WINDOW,
    steps=(Resample(rate=RATE, method="fft", length="floor"), NanTo(0.0), Window(WINDOW, first=True)),
    layout="channels_first",
    notes="raw mV, FFT-resampled (scipy.signal.resample) to 100 Hz over the whole record, NaN set to 0 after "
          "resampling, no filter and no normalisation; the first 10 s (the CPSC and Georgia scripts crop the first "
          "1000 samples). Pretraining read MIMIC-IV-ECG in its stored order (I, II, III, aVR, aVF, aVL, V1-V6); "
          "ECGFM-KED's downstream code (and this contract) feeds the canonical order.")

# The corpus settings closest to the contract: 100 Hz, 10 s; a corpus always filters and
# standardises, the contract does neither (the widest band PreprocessConfig allows).
PREPROCESS = PreprocessConfig(sampling_rate=RATE, window_s=10.0, highpass_hz=0.05, lowpass_hz=49.0,
                              standardize="record")


class _ResBlock(nn.Module):
    """A bottleneck block: (B, c_in, T) -> (B, width * 4, ceil(T / stride)), ReLU(convpath + idpath)."""

    def __init__(self, c_in: int, width: int, kernel: int, stride: int):
        super().__init__()
        c_out = width * EXPANSION
        self.convs = nn.Sequential(conv_bn(c_in, width, 1), conv_bn(width, width, kernel, stride),
                                   conv_bn(width, c_out, 1, relu=False, zero=True))
        self.convpath = nn.Sequential(self.convs)          # the same module twice: both names are in the file
        pool = [nn.AvgPool1d(2, ceil_mode=True)] if stride != 1 else []
        proj = [conv_bn(c_in, c_out, 1, relu=False)] if c_in != c_out else []
        self.idpath = nn.Sequential(*pool, *proj)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.convpath(x) + self.idpath(x))


class EcgFmKedEncoder(SequenceEncoder):
    """ECGFM-KED's xresnet1d101 behind coreecg's `Encoder` interface: (B, C, T) -> Encoded over
    L = ceil(T / patch_size) steps of width `dim` (768 published).

    The network reads the 12 leads in the contract's order; `lead_idx` places fewer rows at their
    standard leads' channels (the others 0), as for every sequence encoder. Its children are
    registered as "0", "1", ... so the published state dict loads unchanged.
    """

    def __init__(self, n_leads: int = 12, stem: tuple[int, ...] = (32, 32, 64),
                 widths: tuple[int, ...] = (64, 128, 128, 192), layers: tuple[int, ...] = (3, 4, 23, 3),
                 kernel_size: int = 5, kernel_size_stem: int = 5):
        super().__init__()
        chans = [n_leads, *stem]
        body: list[nn.Module] = [conv_bn(a, b, kernel_size_stem, 2 if i == 0 else 1)
                                 for i, (a, b) in enumerate(zip(chans, chans[1:]))]
        body.append(nn.MaxPool1d(3, 2, 1))
        c_in = stem[-1]
        for s, (width, n) in enumerate(zip(widths, layers)):
            blocks = []
            for b in range(n):
                blocks.append(_ResBlock(c_in, width, kernel_size, 2 if s > 0 and b == 0 else 1))
                c_in = width * EXPANSION
            body.append(nn.Sequential(*blocks))
        for i, m in enumerate(body):
            self.add_module(str(i), m)
        self.n_leads, self.dim, self.patch_size = n_leads, c_in, 4 * 2 ** (len(widths) - 1)
        self.source = ""                  # the weights' file, named in errors (set by coreecg.loading)

    @classmethod
    def from_config(cls, config: Config) -> "EcgFmKedEncoder":
        """From a Config: its leads (`model.n_leads`) and sizes (`encoders.ecgfm_ked`)."""
        o = config.encoders.ecgfm_ked
        return cls(config.model.n_leads, tuple(o.stem), tuple(o.widths), tuple(o.layers), o.kernel_size,
                   o.kernel_size_stem)

    @classmethod
    def _build_for(cls, config, class_names=None, multilabel=None) -> "EcgFmKedEncoder":
        return cls.from_config(config)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T) with no NaN -> (B, dim, L): the backbone's output, ECGFM-KED's ecg_features."""
        if x.shape[1] != self.n_leads:
            raise ValueError(f"{self.source or 'ECGFM-KED encoder'}: input has {x.shape[1]} rows, the network "
                             f"reads {self.n_leads} leads")
        for m in self.children():
            x = m(x)
        return x


# ---------------------------------------------------------------------------- reading the weights


def unpack(payload: Payload) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The release's container -> (its "ecg_model" entry, or the file's entries for a flat or bare
    state dict; its "config" entry, the training yaml)."""
    entries = payload.entries
    recorded = entries.get("config") if isinstance(entries.get("config"), dict) else None
    state = entries.get("ecg_model", entries)
    return (state if isinstance(state, dict) else None), recorded


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> the backbone's state (a prefix "ecg_model." or "module." removed), only the
    stem's and the stages' keys kept (a classification head, the text tower, the query decoder
    dropped); None when the signature keys are absent."""
    for prefix in _PREFIXES:
        sub = {k[len(prefix):]: v for k, v in state.items() if isinstance(k, str) and k.startswith(prefix)}
        if not all(k in sub for k in _SIGNATURE):
            continue
        stages = [int(m.group(1)) for m in map(_BLOCK.match, sub) if m]
        first_stage = min(stages)
        return {k: v for k, v in sub.items()
                if _BLOCK.match(k) or ((m := _STEM.match(k)) is not None and int(m.group(1)) < first_stage)}
    return None


def _shape(state: dict[str, Any], key: str, ndim: int) -> tuple[int, ...]:
    if key not in state:
        raise ValueError(f"missing key {key!r}")
    shape = tuple(state[key].shape)
    if len(shape) != ndim:
        raise ValueError(f"key {key!r} has shape {shape}, expected {ndim} axes (a Conv1d weight)")
    return shape


def read_architecture(state: dict[str, Any], recorded: dict[str, Any] | None = None) -> Config:
    """The config of an ECGFM-KED backbone state dict (as `recognise` returns it): `model` (arch
    "ecgfm_ked", its leads, 1000 samples) and `encoders.ecgfm_ked` (its sizes); ValueError naming
    the key for a missing key, a wrong shape, an unexpected key or a `convs` tensor that differs
    from its `convpath` twin. `recorded` (the training yaml) names no backbone size: unused."""
    stage_ids = sorted({int(m.group(1)) for m in map(_BLOCK.match, state) if m})
    if not stage_ids:
        raise ValueError("no residual-stage keys ('<stage>.<block>.convs.*')")
    n_stem = stage_ids[0] - 1                             # the max-pool sits between stem and stages
    if n_stem < 1:
        raise ValueError(f"the first stage is module {stage_ids[0]}: no room for a stem and its max-pool")
    stem_shapes = [_shape(state, f"{i}.0.weight", 3) for i in range(n_stem)]
    n_leads, kernel_stem = stem_shapes[0][1], stem_shapes[0][2]
    stem = tuple(s[0] for s in stem_shapes)
    n_stages = stage_ids[-1] - n_stem
    widths, layers = [], []
    for s in range(n_stages):
        i = n_stem + 1 + s
        blocks = {int(m.group(2)) for m in map(_BLOCK.match, state) if m and int(m.group(1)) == i}
        if not blocks:
            raise ValueError(f"missing key '{i}.0.convs.0.0.weight' (stage {s} has no blocks)")
        first, last = _shape(state, f"{i}.0.convs.0.0.weight", 3), _shape(state, f"{i}.0.convs.2.0.weight", 3)
        if last[0] != first[0] * EXPANSION:
            raise ValueError(f"key '{i}.0.convs.2.0.weight' has shape {last}, expected ({first[0] * EXPANSION}, "
                             f"{first[0]}, 1) because bottleneck blocks expand their width {first[0]} by {EXPANSION}")
        widths.append(first[0])
        layers.append(max(blocks) + 1)
    kernel = _shape(state, f"{n_stem + 1}.0.convs.1.0.weight", 3)[2]
    try:
        sizes = EcgFmKedOptions(stem=stem, widths=tuple(widths), layers=tuple(layers), kernel_size=kernel,
                                kernel_size_stem=kernel_stem)
    except (ConfigError, TypeError, ValueError) as e:
        raise ValueError(f"the sizes read from the weights do not fit together: {e}") from e
    _check_keys(state, n_leads, sizes)
    return Config(model=ModelConfig(arch=NAME, n_leads=n_leads, input_samples=WINDOW),
                  encoders=EncoderOptions({NAME: sizes}))


def _check_keys(state: dict[str, Any], n_leads: int, o: EcgFmKedOptions) -> None:
    """Every key of the module of these sizes present with its shape, no other key, and every
    `convs` tensor equal to its `convpath.0` twin (one tensor in the published module)."""
    with torch.device("meta"):
        expected = EcgFmKedEncoder(n_leads, o.stem, o.widths, o.layers, o.kernel_size, o.kernel_size_stem).state_dict()
    why = (f"the sizes read from the weights (leads {n_leads}, stem {list(o.stem)}, widths {list(o.widths)}, "
           f"layers {list(o.layers)}, kernels {o.kernel_size_stem}/{o.kernel_size})")
    for key, ref in expected.items():
        if key not in state:
            raise ValueError(f"missing key {key!r} (expected by {why})")
        if tuple(state[key].shape) != tuple(ref.shape):
            raise ValueError(f"key {key!r} has shape {tuple(state[key].shape)}, expected {tuple(ref.shape)} "
                             f"because of {why}")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise ValueError(f"unexpected key {extra[0]!r} ({len(extra)} in all) for {why}")
    for key in expected:
        if ".convs." in key:
            twin = key.replace(".convs.", ".convpath.0.", 1)
            if not torch.equal(state[key], state[twin]):
                raise ValueError(f"key {key!r} differs from {twin!r}: they are one tensor in the published module")


EcgFmKedEncoder.output_kind = "sequence"
register_encoder(NAME)(EcgFmKedEncoder)
register(PublishedFamily(
    releases=(
        ('best_valid_all_increase_with_augment_epoch_3.pt',
         'Zenodo record 14881564 (zenodo.org/records/14881564)'),
    ),
    name=NAME, title="ECGFM-KED (Tian et al., Cell Reports Medicine 2024)", label="ECGFM-KED",
    recognise=recognise, unpack=unpack, read_architecture=read_architecture, build=EcgFmKedEncoder.from_config,
    preprocess=PREPROCESS, contract=CONTRACT, module="coreecg.model.published.ecgfm_ked.EcgFmKedEncoder",
    licence="code: no licence file in control-spiderman/ECGFM-KED (no rights granted); weights: Zenodo record "
            "14881564, its licence not checked by coreecg; check both before any use beyond research",
    pooling="mean over time of the backbone's output (ecg_features.mean(-1))",
    normalisation="none: raw mV (FFT-resampled to 100 Hz, NaN set to 0)",
    pretraining="MIMIC-IV-ECG v1.0 (PhysioNet, open access: about 800,000 10-s 12-lead ECGs at 500 Hz of nearly "
                "160,000 patients) with their reports, contrasted with a Bio_ClinicalBERT "
                "text tower and a query decoder over knowledge-enhanced label descriptions",
    pretrained_on=("mimic-iv-ecg",), commercial_use=False,
))
