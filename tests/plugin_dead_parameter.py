"""A pretraining method with a parameter its loss never reaches (as CPC's heads past the last segment
were, issue 61): on 2 workers DDP refuses it at the second step, the same way on every restart."""
from torch import nn

from coreecg.methods import register_method
from tests.plugin_method import PatchRegression, PatchRegressionOptions


@register_method("dead_head", "Patch regression with a dead head", options=PatchRegressionOptions, needs="grid")
class DeadHead(PatchRegression):
    def __init__(self, config):
        super().__init__(config)
        self.dead = nn.Linear(self.encoder.dim, 4)            # in no forward: never a gradient


@register_method("broken_forward", "Patch regression with a bug", options=PatchRegressionOptions, needs="grid")
class BrokenForward(PatchRegression):
    def forward(self, x, generator=None, patient=None):
        raise ValueError("a bug in forward: the same on every restart")
