"""The device: which one a run or an inference uses, moving small tensors to it, its generators
and its precision."""
from __future__ import annotations

import contextlib

import torch


class DeviceError(ValueError):
    """A device that this process cannot use (named)."""


def resolve_device(name: str) -> torch.device:
    """cpu | cuda[:i] | auto (CUDA when available, else CPU) -> the device. DeviceError for a
    CUDA device asked for where torch sees none: never a silent run on the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise DeviceError(f"device {name!r}: not a device torch knows (cpu, cuda, cuda:0, auto): {e}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {name!r}: torch sees no CUDA device (use cpu or auto)")
    return device


def autocast(precision: str, device: torch.device):
    """bf16 autocast when asked for, or by default ("auto") on CUDA; fp32 otherwise."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a model's inputs take: its first floating parameter's (float32 when none; a bf16
    copy for inference: coreecg.inference.precision)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor (masks, indices) onto `device` without stalling the host: pinned,
    non-blocking on CUDA; unchanged when it is already there."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        # Contiguous before pinning: a strided pinned tensor is staged through pageable memory.
        return t.contiguous().pin_memory().to(device, non_blocking=True)
    return t.to(device)


def generator_on(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator that draws on `device`: `generator` itself when it lives there, else a device
    generator seeded from it (a host generator with a GPU batch: no device sync, reproducible)."""
    if generator is None or generator.device == device:
        return generator
    seed = int(torch.randint(0, 2**62, (), generator=generator, device=generator.device))
    return torch.Generator(device).manual_seed(seed)


def trial_device(use_gpu: bool | str) -> torch.device:
    """The device of a run in a Tune trial's own process: CUDA when the config asks for a GPU
    (Ray then gave the trial one), else CPU. A GPU asked for and absent is an error, never a
    silent run on the CPU. "auto" (a config no job resolved: coreecg.cluster.plan_devices
    resolves it before any run): CUDA when this process sees one, else CPU."""
    if use_gpu == "auto":
        return resolve_device("auto")
    if not use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("train.use_gpu=true but this process sees no CUDA device "
                           "(set train.use_gpu=false to train on CPU)")
    return torch.device("cuda")
