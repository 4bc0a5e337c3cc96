"""Inference precision: which paths this processor runs fast (detected, never assumed), one model
prepared for a path, and the choice `auto` makes.

Paths (docs/inference.md "Precision"; the measurements behind them: docs/performance.md):

    fp32   the weights as trained, float32 matrix products.
    bf16   on the CPU: a copy of the model with its float weights and buffers in bfloat16, fed
           bfloat16 windows (the matrix products on the processor's bf16 units: AVX-512 BF16 or
           AMX); outputs back in float32. On CUDA: bf16 autocast (training's own path).
    int8   on the CPU only: dynamic int8 quantisation of the model's Linear layers (weights int8
           per tensor, activations quantised per batch; the VNNI units), every other layer float32.
           Refused for a model whose Linear layers hold under INT8_MIN_LINEAR_SHARE of its FLOPs
           (a convolutional encoder: nothing to gain, so nothing claimed).

`auto`: bf16 on CUDA; on the CPU bf16 where the processor has bf16 matrix units
(`cpu_units`) and the model has not been refused it (its recorded check, `precision_check`),
else fp32. int8 is never chosen by `auto`: it is slower than bf16 where bf16 units exist
(measured) and its accuracy cost is larger; it is there to be asked for. A path's accuracy
against fp32 is checked on the first forward pass of every inference run too
(`coreecg.inference.precision_check.first_pass_guard`).

Lazy imports: torch.ao.quantization, in `prepare_model` for int8 only.
"""
from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from coreecg.inference.fused import available as onednn_bf16_linear, fold_batch_norms, fuse_linears

PRECISIONS = ("auto", "fp32", "bf16", "int8")
# The share of a model's forward FLOPs its Linear layers must hold for int8 to be offered: dynamic
# quantisation speeds up nothing else, and below half the model stays mostly float32.
INT8_MIN_LINEAR_SHARE = 0.5
# COREECG_CPU_UNITS simulates a processor: "none", or a comma list of bf16, int8, amx (tests).
UNITS_ENV = "COREECG_CPU_UNITS"


class PrecisionError(ValueError):
    """A precision path that cannot be used for this model on this device, saying why."""


@dataclass(frozen=True)
class CpuUnits:
    """The processor's matrix units as torch's cpuinfo sees them.

    bf16: AVX-512 BF16 or AMX tiles (bf16 matrix products in hardware); int8: VNNI (AVX-512 or
    AVX) or AMX; amx: AMX tiles; source: where the answer came from."""

    bf16: bool
    int8: bool
    amx: bool
    source: str

    def describe(self) -> str:
        have = [n for n, v in (("bf16", self.bf16), ("int8/VNNI", self.int8), ("AMX", self.amx)) if v]
        return f"{', '.join(have) or 'no bf16 or int8 matrix units'} ({self.source})"


def cpu_units(simulate: str | Iterable[str] | None = None) -> CpuUnits:
    """This processor's bf16 / int8 matrix units (torch.cpu's cpuinfo checks), or a simulated set:
    `simulate` or $COREECG_CPU_UNITS ("none" or a comma list of bf16, int8, amx)."""
    given = simulate if simulate is not None else os.environ.get(UNITS_ENV)
    if given is not None:
        names = {s.strip().lower() for s in (given.split(",") if isinstance(given, str) else given)} - {"", "none"}
        unknown = names - {"bf16", "int8", "amx"}
        if unknown:
            raise ValueError(f"{UNITS_ENV}={given!r}: unknown unit(s) {sorted(unknown)}; use bf16, int8, amx or none")
        return CpuUnits("bf16" in names, "int8" in names, "amx" in names, f"simulated: {given!r}")
    amx = bool(torch.cpu._is_amx_tile_supported())
    return CpuUnits(bf16=amx or bool(torch.cpu._is_avx512_bf16_supported()),
                    int8=amx or bool(torch.cpu._is_vnni_supported()), amx=amx, source="torch.cpu cpuinfo")


@dataclass(frozen=True)
class Choice:
    """A resolved precision: `precision` (fp32, bf16, int8) and why it was chosen."""

    precision: str
    reason: str


def resolve_precision(requested: str, device: torch.device, units: CpuUnits | None = None,
                      refused: dict[str, str] | None = None) -> Choice:
    """`requested` (PRECISIONS) on `device` -> Choice; PrecisionError for an explicit path this
    device cannot run. `refused`: {precision: reason} of the model's recorded check (those paths
    are refused when asked for, and skipped by auto)."""
    if requested not in PRECISIONS:
        raise PrecisionError(f"precision {requested!r}: choose one of {', '.join(PRECISIONS)}")
    refused = refused or {}
    if requested in refused:
        raise PrecisionError(f"precision {requested} is refused for this model: {refused[requested]}")
    if device.type == "cuda":
        if requested == "int8":
            raise PrecisionError("precision int8 is a CPU path (dynamic quantisation); on CUDA use bf16 or fp32")
        if requested == "auto":
            if "bf16" in refused:
                return Choice("fp32", f"auto: bf16 refused for this model ({refused['bf16']})")
            return Choice("bf16", "auto: bf16 autocast on CUDA")
        return Choice(requested, "asked for")
    units = units or cpu_units()
    if requested == "bf16" and not units.bf16:
        raise PrecisionError(f"precision bf16: this processor has no bf16 matrix units ({units.describe()}); "
                             "bf16 would be emulated, slower than fp32: use fp32 (or auto)")
    if requested == "auto":
        if not units.bf16:
            return Choice("fp32", f"auto: fp32, no bf16 matrix units on this processor ({units.describe()})")
        if "bf16" in refused:
            return Choice("fp32", f"auto: fp32, bf16 refused for this model ({refused['bf16']})")
        return Choice("bf16", f"auto: bf16 on this processor's bf16 units ({units.describe()})")
    return Choice(requested, "asked for")


def linear_share(model: nn.Module, example: torch.Tensor) -> float:
    """The share of `model`'s forward FLOPs (torch's FlopCounterMode: matrix products and
    convolutions) done in its nn.Linear layers, on `example` (any batch) through its `features`
    (a Classifier's, an inference PooledEncoder's) or its forward."""
    linear = [0]

    def count(module: nn.Linear, _inputs, output) -> None:
        linear[0] += 2 * output.numel() * module.in_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, nn.Linear)]
    counter = FlopCounterMode(display=False)
    try:
        # no_grad, not inference_mode: a weight-normed (parametrized) layer fails under FlopCounterMode
        # in inference mode (torch 2.13; HuBERT-ECG's convolution)
        with counter, torch.no_grad():
            getattr(model, "features", model)(example)
    finally:
        for h in hooks:
            h.remove()
    total = counter.get_total_flops()
    return float(linear[0] / total) if total else 0.0


def prepare_model(model: nn.Module, precision: str, device: torch.device,
                  example: torch.Tensor | None = None, fuse: bool = True) -> tuple[nn.Module, str]:
    """`model` (eval, on `device`) for a resolved path -> (the model to run, the autocast setting
    for `coreecg.devices.autocast`). fp32 and CUDA bf16 run the model itself; CPU bf16 and int8 a
    copy (the float32 model stays as it was, for the first-pass check). With `fuse`
    (inference.fuse; coreecg.inference.fused) the CPU bf16 copy's BatchNorms are folded into their
    convolutions and its Linear layers fused with their bias and GELU where oneDNN can.
    PrecisionError for int8 on a model whose Linear layers hold under INT8_MIN_LINEAR_SHARE of its
    FLOPs (`example`: one model input, needed for int8)."""
    if precision == "fp32":
        return model, "fp32"
    if precision == "bf16":
        if device.type == "cuda":
            return model, "bf16"
        prepared = copy.deepcopy(model).eval()
        if fuse:
            fold_batch_norms(prepared)                # in float32, before the cast
        prepared = prepared.to(torch.bfloat16)
        if fuse and onednn_bf16_linear():
            fuse_linears(prepared)
        return prepared, "fp32"
    if precision != "int8":
        raise PrecisionError(f"precision {precision!r}: not a resolved path (fp32, bf16, int8)")
    if device.type != "cpu":
        raise PrecisionError("precision int8 is a CPU path (dynamic quantisation)")
    if example is None:
        raise PrecisionError("precision int8: prepare_model needs an example input to measure the Linear layers' share")
    share = linear_share(model, example)
    if share < INT8_MIN_LINEAR_SHARE:
        raise PrecisionError(f"precision int8: this model's Linear layers hold {share:.0%} of its FLOPs (under "
                             f"{INT8_MIN_LINEAR_SHARE:.0%}); dynamic int8 quantises only Linear layers, so it would "
                             "gain nothing: use bf16 or fp32")
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        # torch.ao's eager quantisation is deprecated for torchao; it is the one dynamic-int8 path in
        # torch 2.13 itself (docs/decisions.md "CPU inference precision").
        warnings.simplefilter("ignore")
        try:
            return quantize_dynamic(copy.deepcopy(model).cpu().eval(), {nn.Linear}, dtype=torch.qint8), "fp32"
        except (AttributeError, RuntimeError, TypeError) as e:
            # measured: HuBERT-ECG's weight-normed convolution (a parametrized module) cannot be walked
            raise PrecisionError(f"precision int8: dynamic quantisation cannot convert this model "
                                 f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


__all__ = ["CpuUnits", "Choice", "INT8_MIN_LINEAR_SHARE", "PRECISIONS", "PrecisionError", "cpu_units",
           "linear_share", "prepare_model", "resolve_precision"]
