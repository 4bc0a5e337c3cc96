"""The CPU bf16 path's fused layers (`inference.fuse`, docs/inference.md "Precision"): BatchNorm
folded into the convolution before it, and oneDNN-fused Linear layers.

`fold_batch_norms` (on the float32 copy, before its cast to bf16) replaces each eval-mode
BatchNorm that directly follows a convolution in an nn.Sequential by its affine map folded into
that convolution's weight and bias (torch.nn.utils.fusion.fuse_conv_bn_eval): one pass over the
activations fewer, and no BatchNorm in bfloat16 (xresnet1d's bf16 records/s 1.10x; on the bare
model with non-trivial BatchNorm statistics its difference from float32 went from 0.0090 of the
embedding norm to 0.0055).

In eager PyTorch a bfloat16 nn.Linear on the CPU is three passes over its output: the bias
broadcast copied into a fresh buffer, the product added onto it, and (in a transformer's MLP) the
GELU as a pass of its own over a fresh buffer. oneDNN's linear primitive does all three in one:
the bias and the GELU run in the product's epilogue on tiles still in cache
(`torch.ops.mkldnn._linear_pointwise`, the op inductor's own CPU fusions emit). Measured on a
Xeon with AMX (docs/performance.md "CPU inference, 2026-12-03, second session"): the GELU of a (8640, 1024)
bfloat16 product takes 1.8 ms in the epilogue against 10.7 ms as its own pass; the paper-size
ViT's records/s through the engine 1.06-1.10x. The numbers are bf16's (the same products, accumulated in
float32, rounded once): the path's check against float32 covers them.

`fuse_linears` swaps, in a bfloat16 copy prepared for inference, every plain nn.Linear for a
FusedLinear, taking in the nn.GELU that directly follows it inside an nn.Sequential (the GELU
becomes an nn.Identity, so module names and the state dict's keys do not move). A subclass of
nn.Linear and a Linear owned by an nn.MultiheadAttention (which reads its weight, never calls
it) stay as they are. A run of two or more 1x1 nn.Conv1d layers in an nn.Sequential (S4's stem;
GELUs between them taken in) becomes one PointwiseStack: the same products over the channels of
the (B, L, C) view, so the run costs no layout reorders (oneDNN's convolution copies its input
and output into its blocked layout and back): S4's bf16 records/s 1.22x. Its keys move (the
prepared copy's state dict is never saved).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

# GELU's `approximate` -> oneDNN's algorithm name for the fused epilogue
_GELU_ALGORITHM = {"none": "none", "tanh": "tanh"}


@functools.cache
def available() -> bool:
    """Whether this torch build has oneDNN's fused linear with bfloat16 on this processor (asked once)."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None and hasattr(ops, "_linear_pointwise")
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


class FusedLinear(nn.Module):
    """An nn.Linear (and the GELU after it, `gelu`: its `approximate`, or None) as one oneDNN
    product: (..., in_features) -> (..., out_features). Its parameters are the Linear's own
    (`weight`, `bias`). Off the CPU, in another dtype, under autograd or while compiling (inductor
    lowers the op only with frozen weights, and fuses the plain form itself), or where oneDNN has
    no bf16 linear (`available`), it runs F.linear and F.gelu: the same function."""

    def __init__(self, linear: nn.Linear | nn.Conv1d, gelu: str | None = None):
        super().__init__()
        if gelu is not None and gelu not in _GELU_ALGORITHM:
            raise ValueError(f"FusedLinear: GELU approximate={gelu!r} (none or tanh)")
        if isinstance(linear, nn.Conv1d):            # a 1x1 convolution: its (out, in, 1) weight, a view
            if not pointwise(linear):
                raise ValueError(f"FusedLinear: {linear} is not a 1x1 convolution")
            self.in_features, self.out_features = linear.in_channels, linear.out_channels
        else:
            self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.gelu = gelu

    def _matrix(self) -> torch.Tensor:
        return self.weight if self.weight.dim() == 2 else self.weight[..., 0]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"gelu={self.gelu}")

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self._matrix(), self.bias)
        return y if self.gelu is None else F.gelu(y, approximate=self.gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the op has no backward (a frozen encoder under autograd would lose its input's gradient)
        if (x.device.type != "cpu" or x.dtype != self.weight.dtype or x.dtype != torch.bfloat16
                or torch.compiler.is_compiling() or not available()
                or (torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad))):
            return self._plain(x)
        w = self._matrix()
        if self.gelu is None:
            return torch.ops.mkldnn._linear_pointwise(x, w, self.bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x, w, self.bias, "gelu", [], _GELU_ALGORITHM[self.gelu])


def pointwise(m: nn.Module) -> bool:
    """Whether `m` is a plain 1x1 nn.Conv1d (stride 1, no padding, dilation or groups)."""
    return (type(m) is nn.Conv1d and m.kernel_size == (1,) and m.stride == (1,) and m.dilation == (1,)
            and m.groups == 1 and m.padding in ((0,), "valid") and m.padding_mode == "zeros")


class PointwiseStack(nn.Module):
    """A run of 1x1 Conv1d layers, each with the GELU after it or none, on (B, C, L) -> (B, C', L):
    FusedLinear products over the channels of the (B, L, C) view (a transpose in and one out,
    both views: a following `.transpose(1, 2)`, as S4's stem makes, is then free). The output is
    that transposed view, not contiguous: a `.view` of it needs a `.contiguous()` first."""

    def __init__(self, layers: list[tuple[nn.Conv1d, str | None]]):
        super().__init__()
        self.products = nn.ModuleList(FusedLinear(conv, gelu) for conv, gelu in layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.transpose(1, 2)
        for product in self.products:
            h = product(h)
        return h.transpose(1, 2)


_CONV_BN = ((nn.Conv1d, nn.BatchNorm1d), (nn.Conv2d, nn.BatchNorm2d))


def fold_batch_norms(model: nn.Module) -> int:
    """Fold every eval-mode BatchNorm (with running statistics) that directly follows a convolution
    of its dimension in an nn.Sequential into that convolution, in place; the BatchNorm becomes an
    nn.Identity -> how many were folded. For a model in eval (its BatchNorms use their running
    statistics); call on float32 weights (the fold is computed in their dtype)."""
    folded = 0
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        children = list(seq.named_children())
        for (name, conv), (bn_name, bn) in zip(children, children[1:]):
            if any(type(conv) is c and type(bn) is b for c, b in _CONV_BN) and not bn.training \
                    and bn.running_mean is not None and not conv.training:
                setattr(seq, name, fuse_conv_bn_eval(conv, bn))
                setattr(seq, bn_name, nn.Identity())
                folded += 1
    return folded


def _gelu_at(children: list[tuple[str, nn.Module]], i: int) -> str | None:
    """The `approximate` of an nn.GELU at children[i] that can join a product, else None."""
    if i < len(children) and type(children[i][1]) is nn.GELU and children[i][1].approximate in _GELU_ALGORITHM:
        return children[i][1].approximate
    return None


def _fuse_pointwise_runs(seq: nn.Sequential) -> int:
    """Runs of two or more 1x1 convolutions in `seq` (GELUs between taken in) -> PointwiseStack at
    the run's first place, Identity at the others; -> convolutions swapped."""
    children = list(seq.named_children())
    swapped, i = 0, 0
    while i < len(children):
        run, j = [], i
        while j < len(children) and pointwise(children[j][1]):
            gelu = _gelu_at(children, j + 1)
            run.append((children[j][1], gelu))
            j += 2 if gelu else 1
        if len(run) >= 2:
            setattr(seq, children[i][0], PointwiseStack(run))
            for name, _ in children[i + 1:j]:
                setattr(seq, name, nn.Identity())
            swapped += len(run)
        i = max(j, i + 1)
    return swapped


def fuse_linears(model: nn.Module) -> int:
    """Swap `model`'s plain nn.Linear layers for FusedLinear, and its runs of 1x1 convolutions for
    PointwiseStack, in place (module docstring) -> how many products were swapped. Their GELUs
    (an nn.GELU right after one in an nn.Sequential) join them."""
    swapped = 0
    for parent in list(model.modules()):
        if isinstance(parent, (nn.MultiheadAttention, FusedLinear, PointwiseStack)):
            continue
        if isinstance(parent, nn.Sequential):
            swapped += _fuse_pointwise_runs(parent)
        children = list(parent.named_children())
        for i, (name, child) in enumerate(children):
            if type(child) is not nn.Linear:
                continue
            gelu = _gelu_at(children, i + 1) if isinstance(parent, nn.Sequential) else None
            if gelu is not None:
                setattr(parent, children[i + 1][0], nn.Identity())
            setattr(parent, name, FusedLinear(child, gelu))
            swapped += 1
    return swapped


__all__ = ["FusedLinear", "PointwiseStack", "available", "fold_batch_norms", "fuse_linears", "pointwise"]
