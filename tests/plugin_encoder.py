"""A complete encoder outside coreecg: a small 1-D ResNet, one file (docs/encoders.md shows it;
tests take it through pretraining, export and loading in a fresh process). `plugins:
[tests.plugin_encoder]` and `model.arch: tiny_resnet` select it; `encoders.tiny_resnet.*` sizes it."""
from dataclasses import dataclass

import torch
from torch import nn

from coreecg.encoders import register_encoder
from coreecg.model.sequence import SequenceEncoder


@dataclass
class TinyResNetOptions:               # the typed config section encoders.tiny_resnet
    width: int = 16
    blocks: int = 2

    def __post_init__(self):
        if self.width < 1 or self.blocks < 1:
            raise ValueError("width and blocks must be >= 1")


class _Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(width, width, 7, padding=3), nn.BatchNorm1d(width), nn.ReLU(),
                                  nn.Conv1d(width, width, 7, padding=3), nn.BatchNorm1d(width))

    def forward(self, x):
        return torch.relu(x + self.conv(x))


@register_encoder("tiny_resnet", "A tiny 1-D ResNet", output="sequence", options=TinyResNetOptions)
class TinyResNet(SequenceEncoder):
    def __init__(self, n_leads: int = 12, width: int = 16, blocks: int = 2):
        super().__init__()
        self.n_leads, self.dim, self.patch_size = n_leads, width, 4       # one step per 4 samples
        self.stem = nn.Conv1d(n_leads, width, 4, stride=4)
        self.blocks = nn.ModuleList(_Block(width) for _ in range(blocks))   # "blocks.<i>.": layer-wise decay

    @classmethod
    def from_config(cls, config):
        o = config.encoders.tiny_resnet
        return cls(config.model.n_leads, o.width, o.blocks)

    @classmethod
    def _build_for(cls, config, class_names=None, multilabel=None):
        return cls.from_config(config)

    def features(self, x):             # (B, 12, T) -> (B, width, T // 4)
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return h
