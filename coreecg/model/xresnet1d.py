"""xresnet1d: the 1-D XResNet of the PTB-XL benchmark (Strodthoff et al., IEEE JBHI 2021; its
strongest supervised family), written here from its description: a three-convolution stem (the
first of stride 2) and a max-pool, then stages of residual blocks, stride 2 from the second stage
on, with the XResNet tweaks (an average pool before the shortcut's 1x1 convolution when a block
downsamples; the last batch norm of each residual branch initialised to 0, so every block starts
as the identity). Bottleneck blocks (1x1, k, 1x1; expansion 4) or basic ones (expansion 1).

Output: a sequence over time (coreecg.model.sequence), `patch_size` = the total stride
(2 x 2 x 2^(stages - 1): 32 samples for four stages), `dim` = the last width x expansion.
"""
from __future__ import annotations

import torch
from torch import nn

from coreecg.encoders.build import register_encoder
from coreecg.model.sequence import SequenceEncoder


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, relu: bool = True,
            zero: bool = False) -> nn.Sequential:
    """Conv1d (same padding, no bias) -> BatchNorm (weight 0 when `zero`) -> ReLU (when `relu`)."""
    bn = nn.BatchNorm1d(c_out)
    nn.init.constant_(bn.weight, 0.0 if zero else 1.0)
    layers: list[nn.Module] = [nn.Conv1d(c_in, c_out, kernel, stride, kernel // 2, bias=False), bn]
    return nn.Sequential(*layers, nn.ReLU(inplace=True)) if relu else nn.Sequential(*layers)


class XBlock(nn.Module):
    """One residual block: (B, c_in, T) -> (B, width * expansion, ceil(T / stride))."""

    def __init__(self, c_in: int, width: int, expansion: int, kernel: int, stride: int):
        super().__init__()
        c_out = width * expansion
        if expansion == 1:
            self.branch = nn.Sequential(conv_bn(c_in, width, kernel, stride),
                                        conv_bn(width, c_out, kernel, relu=False, zero=True))
        else:
            self.branch = nn.Sequential(conv_bn(c_in, width, 1), conv_bn(width, width, kernel, stride),
                                        conv_bn(width, c_out, 1, relu=False, zero=True))
        pool = [nn.AvgPool1d(stride, ceil_mode=True)] if stride > 1 else []
        proj = [conv_bn(c_in, c_out, 1, relu=False)] if c_in != c_out else []
        self.shortcut = nn.Sequential(*pool, *proj)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.branch(x) + self.shortcut(x))


class XResNet1d(SequenceEncoder):
    """(B, C, T) -> Encoded over L = ceil(T / patch_size) steps of width `dim`."""

    def __init__(self, n_leads: int = 12, stem: tuple[int, ...] = (32, 32, 64),
                 widths: tuple[int, ...] = (64, 128, 256, 512), layers: tuple[int, ...] = (3, 4, 23, 3),
                 expansion: int = 4, kernel_size: int = 5, dropout: float = 0.0):
        super().__init__()
        self.n_leads, self.kernel_size = n_leads, kernel_size
        chans = [n_leads, *stem]
        self.stem = nn.Sequential(*(conv_bn(a, b, kernel_size, 2 if i == 0 else 1)
                                    for i, (a, b) in enumerate(zip(chans, chans[1:]))),
                                  nn.MaxPool1d(3, 2, 1))
        blocks, c_in = [], stem[-1]
        for s, (width, n) in enumerate(zip(widths, layers)):
            for b in range(n):
                blocks.append(XBlock(c_in, width, expansion, kernel_size, 2 if s > 0 and b == 0 else 1))
                c_in = width * expansion
        # one list, so layer-wise decay reads each block's depth from "blocks.<i>." (coreecg.train.optim)
        self.blocks = nn.ModuleList(blocks)
        self.drop = nn.Dropout(dropout)
        self.dim = c_in
        self.patch_size = 4 * 2 ** (len(widths) - 1)
        for m in self.modules():
            if isinstance(m, nn.Conv1d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")

    @classmethod
    def from_config(cls, config) -> "XResNet1d":
        o = config.encoders.xresnet1d
        return cls(config.model.n_leads, tuple(o.stem), tuple(o.widths), tuple(o.layers), o.expansion,
                   o.kernel_size, o.dropout)

    @classmethod
    def _build_for(cls, config, class_names=None, multilabel=None) -> "XResNet1d":
        return cls.from_config(config)

    @property
    def receptive_field(self) -> int:
        """Input samples one output step can see (the stem, the pool and every block's branch)."""
        rf, jump = 1, 1
        n_stem = len(self.stem) - 1                                   # its convolutions, then the pool
        layers = [(self.kernel_size, 2)] + [(self.kernel_size, 1)] * (n_stem - 1) + [(3, 2)]
        for block in self.blocks:
            for conv in (m for m in block.branch.modules() if isinstance(m, nn.Conv1d)):
                layers.append((conv.kernel_size[0], conv.stride[0]))
        for k, s in layers:
            rf += (k - 1) * jump
            jump *= s
        return rf

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.drop(h)


register_encoder("xresnet1d")(XResNet1d)
