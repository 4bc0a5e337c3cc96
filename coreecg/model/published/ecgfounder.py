"""ECGFounder (Li et al., NEJM AI 2025): its published Net1D, read as data and run by coreecg's own code.

ECGFounder is a supervised model (150 labels of HEEDB, ~10M ECGs), not a self-supervised one; its
backbone is Net1D, a RegNet-style 1-D CNN with squeeze-excitation. Two files are published,
`12_lead_ECGFounder.pth` (12 leads) and `1_lead_ECGFounder.pth` (lead I), the same architecture
but for the first convolution's input channels. Each is a `torch.save` dict

    {"epoch", "step", "state_dict": Net1D's state dict, "optimizer": Adam's, "scheduler", "val_auroc"}

whose `val_auroc` is a numpy scalar, so `torch.load(weights_only=True)` refuses it: files.py's
inert unpickler reads it (the scalar becomes a placeholder; nothing is imported). `unpack` takes
"state_dict" (optimizer and scheduler are dropped; there is no recorded config).

Keys of the state dict (S a stage, B a block, C input channels, F0 the first width, Fs a stage's):

    first_conv.conv.{weight (F0, C, k), bias}                       SAME convolution, stride 2
    stage_list.S.block_list.B.conv1.conv   (M, C_in, 1)             1x1, M = int(Fs * ratio)
    stage_list.S.block_list.B.conv2.conv   (M, M / groups, k)       grouped, groups = Fs // 16
    stage_list.S.block_list.B.conv3.conv   (Fs, M, 1)               1x1
    stage_list.S.block_list.B.se_fc1, se_fc2  (Fs // 2, Fs), (Fs, Fs // 2)   squeeze-excitation
    first_bn.*, stage_list.S.block_list.B.bn{1,2,3}.*   BatchNorms: DROPPED (never applied, below)
    dense.{weight, bias} (150, D)                       the 150-label head: DROPPED

The computation (Net1D with use_bn=False, use_do=False, as ECGFounder's scripts build it): the
first convolution -> Swish; then per block: [Swish unless it is the very first block of stage 0]
-> conv1 -> Swish -> conv2 (stride 2 in a stage's first block) -> Swish -> conv3 -> x SE gate
(sigmoid(se_fc2(Swish(se_fc1(mean over time))))); the shortcut of a stage's first block is
max-pooled (kernel 2, after padding ONE ZERO on the right: on an odd length the last output is
max(x[-1], 0)) and zero-padded on the channel axis ((Fout - Fin) // 2 channels before, the rest
after); out + shortcut, no activation after the sum. Every convolution pads "SAME" as TensorFlow
does: pad = max(0, (ceil(L / s) - 1) * s + k - L), left pad // 2, zeros. Swish = x * sigmoid(x)
(F.silu here: the same function, one kernel; it matched the fixture to the same figures).
5000 samples -> 2500 after the first convolution -> halved (ceil) by each of 7 stages: L = 20
steps of D = 1024. The pooled embedding (Net1D's `deep_features`) is the mean over time of the
last stage's output; the tokens are that output (B, L, D).

The architecture is read from the state dict: input channels, the first width and the kernel from
first_conv, the stages and blocks from the key names, each stage's width from its conv3, the ratio
from conv1, the group width from conv2, the SE reduction from se_fc1; every key's shape is then
checked against the module those sizes build. The strides are not in the weights: 2 (Net1D's
first convolution and ECGFounder's `stride=2`). The input rate and window (500 Hz, 5000 samples)
are the contract's; the network itself takes any length.

Traps: the BatchNorm tensors are in the file but use_bn=False applies none (loading them into a
use_bn=True Net1D gives other outputs); the shortcut's max-pool pads with 0, not -inf; the z-score
of the input is over leads and time together; the 1-lead model's z-score is over lead I alone.

No ECGFounder code is used (its code is MIT): this module names its parameters as the published
state dicts do, so those load with `load_state_dict` unchanged.
"""
from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import STANDARD_LEADS, Config, ConfigError, ModelConfig, PreprocessConfig
from coreecg.config.encoders import EncoderOptions
from coreecg.data.contract import Butter, InputContract, MedianBaseline, NanTo, Normalise, Notch, Window
from coreecg.encoders.build import register_encoder
from coreecg.encoders.published.ecgfounder import ECGFounderOptions
from coreecg.model.published.files import Payload
from coreecg.model.published.registry import PublishedFamily, register
from coreecg.model.sequence import SequenceEncoder

NAME = "ecgfounder"
WINDOW = 5000                         # 10 s at 500 Hz, the length HEEDB's records and the datasets have
_SIGNATURE = ("first_conv.conv.weight", "stage_list.0.block_list.0.conv2.conv.weight",
              "stage_list.0.block_list.0.se_fc1.weight")
_BLOCK = re.compile(r"^stage_list\.(\d+)\.block_list\.(\d+)\.")
_KEEP = re.compile(r"^(first_conv\.conv|stage_list\.\d+\.block_list\.\d+\.(conv[123]\.conv|se_fc[12]))"
                   r"\.(weight|bias)$")

# ECGFounder's dataset.py + util.filter_bandpass: NaN -> 0, notch, Butterworth band-pass (b, a),
# the 0.4 s median baseline subtracted, then one z-score over leads and time. Each 10 s window is
# filtered and normalised on its own, as the datasets treat each 10 s record.
_STEPS = (NanTo(0.0), Window(WINDOW), Notch(50.0, 30.0), Butter(0.67, 40.0, 4, "bandpass", "ba"),
          MedianBaseline(0.4), Normalise("zscore", "record", eps=1e-8, eps_mode="add"))
_NOTES = ("ECGFounder (dataset.py, util.filter_bandpass): each 10 s window is filtered alone (notch, band-pass, "
          "median baseline) and z-scored with one mean and std over all its rows; a record shorter than 10 s "
          "gives no window (the network itself takes any length)")
CONTRACT = InputContract(leads=STANDARD_LEADS, sampling_rate=500, window_samples=WINDOW, steps=_STEPS,
                         notes=_NOTES)
CONTRACT_1_LEAD = InputContract(leads=("I",), sampling_rate=500, window_samples=WINDOW, steps=_STEPS,
                                notes=_NOTES + "; the 1-lead model: lead I alone, z-scored over itself")
CONTRACTS = {12: CONTRACT, 1: CONTRACT_1_LEAD}          # by the model's input channels
# the closest corpus settings (the notch and the median baseline have no PreprocessConfig key)
PREPROCESS = PreprocessConfig(sampling_rate=500, highpass_hz=0.67, lowpass_hz=40.0, standardize="record")


class _SameConv(nn.Module):
    """Conv1d with TensorFlow's SAME padding (zeros, the odd one on the right):
    (B, C_in, L) -> (B, C_out, ceil(L / stride))."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, s, L = self.conv.kernel_size[0], self.conv.stride[0], x.shape[-1]
        pad = max(0, (-(-L // s) - 1) * s + k - L)
        return self.conv(F.pad(x, (pad // 2, pad - pad // 2)))


class _Block(nn.Module):
    """Net1D's pre-activation bottleneck with squeeze-excitation: (B, c_in, L) -> (B, c_out,
    ceil(L / stride)); `first`: the very first block of the network (its input is activated already)."""

    def __init__(self, c_in: int, c_out: int, o: ECGFounderOptions, stride: int, first: bool):
        super().__init__()
        middle = int(c_out * o.ratio)
        self.c_in, self.c_out, self.stride, self.first = c_in, c_out, stride, first
        self.conv1 = _SameConv(c_in, middle, 1)
        self.conv2 = _SameConv(middle, middle, o.kernel_size, stride, groups=c_out // o.groups_width)
        self.conv3 = _SameConv(middle, c_out, 1)
        self.se_fc1 = nn.Linear(c_out, c_out // o.se_ratio)
        self.se_fc2 = nn.Linear(c_out // o.se_ratio, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x if self.first else F.silu(x))
        out = self.conv3(F.silu(self.conv2(F.silu(out))))
        gate = torch.sigmoid(self.se_fc2(F.silu(self.se_fc1(out.mean(-1)))))          # (B, c_out)
        out = out * gate[..., None]
        if self.stride > 1:      # max-pool of kernel = stride after SAME zero padding (zeros, not -inf)
            pad = self.stride - 1
            x = F.max_pool1d(F.pad(x, (pad // 2, pad - pad // 2)), self.stride)
        if self.c_out != self.c_in:
            grow = self.c_out - self.c_in
            x = F.pad(x, (0, 0, grow // 2, grow - grow // 2))
        return out + x


class _Stage(nn.Module):
    def __init__(self, c_in: int, c_out: int, n_blocks: int, o: ECGFounderOptions, first_stage: bool):
        super().__init__()
        self.block_list = nn.ModuleList(
            _Block(c_in if b == 0 else c_out, c_out, o, o.stride if b == 0 else 1, first_stage and b == 0)
            for b in range(n_blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.block_list:
            x = block(x)
        return x


class ECGFounderEncoder(SequenceEncoder):
    """ECGFounder's Net1D backbone (no head): (B, C, T) -> Encoded over L = ceil(T / patch_size)
    steps of width `dim` (the last stage's output).

    The 12-lead model reads the 12 standard leads in the standard order, the 1-lead model lead I:
    `lead_idx` places each input row at its lead's channel (SequenceEncoder.placed; absent leads 0),
    and a lead the model has no channel for is a ValueError. Layout: (B, C, T), as model_input.npy.
    """

    def __init__(self, n_leads: int = 12, options: ECGFounderOptions | None = None):
        super().__init__()
        o = options or ECGFounderOptions()
        o.check()
        self.n_leads, self.options = n_leads, o
        self.first_conv = _SameConv(n_leads, o.base_filters, o.kernel_size, o.first_stride)
        widths = (o.base_filters, *o.filters)
        self.stage_list = nn.ModuleList(_Stage(widths[s], widths[s + 1], n, o, s == 0) for s, n in enumerate(o.blocks))
        self.dim = o.filters[-1]
        self.patch_size = o.first_stride * o.stride ** len(o.filters)     # 256: input samples per step
        self.source = ""                  # the weights' file, named in errors (set by coreecg.loading)

    @classmethod
    def from_config(cls, config: Config) -> "ECGFounderEncoder":
        """From a Config: its input (`model.n_leads`) and sizes (`encoders.ecgfounder`, read from the weights)."""
        return cls(config.model.n_leads, config.encoders.ecgfounder)

    @classmethod
    def _build_for(cls, config, class_names=None, multilabel=None) -> "ECGFounderEncoder":
        return cls.from_config(config)

    def placed(self, x: torch.Tensor, lead_idx: torch.Tensor | None) -> torch.Tensor:
        if lead_idx is not None and (lead_idx.numel() and int(lead_idx.max()) >= self.n_leads):
            raise ValueError(f"{self.source or 'ECGFounder'}: this {self.n_leads}-lead model reads "
                             f"{', '.join(STANDARD_LEADS[: self.n_leads])}; lead_idx {lead_idx.tolist()} names others")
        return super().placed(x, lead_idx)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T) -> the last stage's output (B, D, L)."""
        h = F.silu(self.first_conv(x))
        for stage in self.stage_list:
            h = stage(h)
        return h


def contract_for(config: Config) -> InputContract:
    """The contract of the file a config was read from: the 12-lead model's or the 1-lead one's
    (`family.contract` is the 12-lead one)."""
    n = config.model.n_leads
    if n not in CONTRACTS:
        raise ValueError(f"ECGFounder publishes 12- and 1-lead models; no contract for {n} leads")
    return CONTRACTS[n]


# ---------------------------------------------------------------------------- reading the weights


def unpack(payload: Payload) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The file's entries -> (its "state_dict", None): the optimizer, scheduler and counters are
    dropped; ECGFounder records no config. A bare state dict is taken as it is."""
    state = payload.entries.get("state_dict", payload.entries)
    return (state if isinstance(state, dict) else None), None


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> Net1D's backbone state (a DataParallel "module." prefix removed; the
    BatchNorms, the `dense` head and every other entry dropped), or None when it is not Net1D's."""
    for prefix in ("", "module."):
        sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if all(k in sub for k in _SIGNATURE):
            return {k: v for k, v in sub.items() if _KEEP.match(k)}
    return None


def _shape(state: dict[str, Any], key: str) -> tuple[int, ...]:
    if key not in state:
        raise ValueError(f"missing key {key!r}")
    return tuple(state[key].shape)


def read_architecture(state: dict[str, torch.Tensor], recorded: dict[str, Any] | None = None) -> Config:
    """The config of a Net1D backbone state (recognise's output): `model` (arch "ecgfounder", its
    input channels, the 5000-sample window) and `encoders.ecgfounder` (its sizes); ValueError
    naming the key for one that is missing or whose shape does not fit. `recorded`: unused
    (ECGFounder's files record no config; the strides are Net1D's fixed 2)."""
    base, n_leads, kernel = _shape(state, "first_conv.conv.weight")
    stages: dict[int, set[int]] = {}
    for key in state:
        m = _BLOCK.match(key)
        if m:
            stages.setdefault(int(m[1]), set()).add(int(m[2]))
    if sorted(stages) != list(range(len(stages))) or not stages:
        raise ValueError(f"stage_list indices {sorted(stages)} are not 0..n-1")
    blocks = []
    for s in range(len(stages)):
        if sorted(stages[s]) != list(range(len(stages[s]))):
            raise ValueError(f"stage_list.{s}: block indices {sorted(stages[s])} are not 0..n-1")
        blocks.append(len(stages[s]))
    filters = tuple(_shape(state, f"stage_list.{s}.block_list.0.conv3.conv.weight")[0] for s in range(len(blocks)))
    first = "stage_list.0.block_list.0."
    middle = _shape(state, first + "conv1.conv.weight")[0]
    per_group = _shape(state, first + "conv2.conv.weight")[1]
    hidden = _shape(state, first + "se_fc1.weight")[0]
    if min(per_group, hidden) < 1 or middle % per_group:
        raise ValueError(f"key {first + 'conv2.conv.weight'!r}: {per_group} channels per group do not divide "
                         f"the middle width {middle}")
    try:
        sizes = ECGFounderOptions(base_filters=base, filters=filters, blocks=tuple(blocks), kernel_size=kernel,
                                  groups_width=filters[0] // (middle // per_group), ratio=middle / filters[0],
                                  se_ratio=filters[0] // hidden)
        sizes.check()
    except (ConfigError, TypeError, ValueError) as e:
        raise ValueError(f"inconsistent shapes: {e}") from e
    _check_shapes(state, n_leads, sizes)
    return Config(model=ModelConfig(arch=NAME, n_leads=n_leads, input_samples=WINDOW),
                  encoders=EncoderOptions({NAME: sizes}))


def _check_shapes(state: dict[str, torch.Tensor], n_leads: int, sizes: ECGFounderOptions) -> None:
    """ValueError naming the first key the sizes read do not build, or whose shape differs."""
    with torch.device("meta"):
        expected = ECGFounderEncoder(n_leads, sizes).state_dict()
    why = (f"{n_leads} input leads, base_filters {sizes.base_filters}, filters {list(sizes.filters)}, blocks "
           f"{list(sizes.blocks)}, kernel {sizes.kernel_size}, groups_width {sizes.groups_width}, ratio "
           f"{sizes.ratio:g}, se_ratio {sizes.se_ratio} (read from stage 0 and the key names)")
    for key, t in expected.items():
        got = _shape(state, key)
        if got != tuple(t.shape):
            raise ValueError(f"key {key!r} has shape {got}, expected {tuple(t.shape)} because of {why}")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise ValueError(f"keys {extra[:3]} do not belong to the Net1D of {why}")


ECGFounderEncoder.output_kind = "sequence"
register_encoder(NAME)(ECGFounderEncoder)
register(PublishedFamily(
    releases=(
        ('12_lead_ECGFounder.pth',
         'Hugging Face PKUDigitalHealth/ECGFounder'),
        ('1_lead_ECGFounder.pth',
         'Hugging Face PKUDigitalHealth/ECGFounder'),
    ),
    name=NAME, title="ECGFounder (Li et al., NEJM AI 2025)", label="ECGFounder", recognise=recognise,
    unpack=unpack, read_architecture=read_architecture, build=ECGFounderEncoder.from_config, preprocess=PREPROCESS,
    contract=CONTRACT, variants=(CONTRACT_1_LEAD,), module="coreecg.model.published.ecgfounder.ECGFounderEncoder",
    licence="code MIT (PKUDigitalHealth/ECGFounder); the weights' model card licence not checked by coreecg",
    pooling="mean over time of the last stage's output (Net1D's deep_features, before the dense head)",
    normalisation="z-score over leads and time together (each 10 s window), + 1e-8 on the std",
    pretraining="HEEDB (Harvard-Emory ECG Database, ~10M ECGs, 150 labels), supervised; not checked by "
                "coreecg's leakage guard",
    pretrained_on=("heedb",), commercial_use=False,
))
