"""Speed and memory options of a training step (docs/performance.md). None changes the numbers
beyond float rounding (tests/test_step_numerics.py).

Host memory. A CPU training step frees and re-allocates the same activation buffers every
step (about 7 GB at the paper's model and a batch of 32). glibc's malloc serves blocks above
32 MB with mmap and returns them to the kernel on free, so every step paid page faults and the
zero-filling of fresh pages again: 1.0-1.7 M minor faults and 3-9 s of system time in a 10-13 s
step. Serving every block from the heap and never trimming it keeps the pages: from the 4th
step on 0-3 faults and 0.05 s of system time, and the step 1.5x faster (docs/performance.md).
The process keeps its peak footprint between steps, which it reaches every step anyway.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch
from torch import nn

from coreecg.config import TrainConfig
from coreecg.model.layers import Block, Transformer

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@functools.cache
def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse (no mmap, no trimming). Idempotent.

    Returns False where it does not apply (not glibc, e.g. macOS or musl): nothing changes there.
    """
    libc = _libc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the kernel (glibc malloc_trim) where keep_freed_memory
    is on; the loop calls it once per epoch. The kept memory can fragment as the student's
    padded length varies (measured: 7.45 -> 7.88 GB at the paper's batch 32 over 10 steps); a
    trim bounds that for the cost of re-faulting one step's pages."""
    if keep_freed_memory.cache_info().currsize and keep_freed_memory():
        _libc().malloc_trim(0)


def apply_speed_options(model: nn.Module, train: TrainConfig) -> nn.Module:
    """Set a model's speed/memory options from `train` (in place; returns the model).

    - train.host_memory_cache (CPU): keep_freed_memory().
    - train.activation_checkpointing: every Transformer recomputes its blocks in backward
      instead of keeping their activations (about a block's input per token kept instead of
      ~16 widths; one more forward of each block).
    - train.compile: each transformer Block compiled with torch.compile in
      train.compile_mode (regional: every Block of a width shares one graph, so compile time does
      not grow with depth). Every graph is built in the first step: a varying sequence length
      (bernoulli STDM) is marked dynamic where it arises (model.layers.Transformer), so nothing
      recompiles later (tests/test_compile_once.py). "reduce-overhead" replays CUDA graphs where
      shapes are fixed (the decoders, the teacher, exact STDM); a dynamic-length graph runs
      without them rather than recording one graph per length.
    """
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    if train.host_memory_cache and device.type == "cpu":
        keep_freed_memory()
    compiled = train.compile
    if compiled:
        # One graph per (width, grad mode, mask or not, layout): the paper's model makes ~8 in a
        # run with its probe, torch's default limit; past it dynamo would silently run eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        torch._inductor.config.triton.cudagraph_skip_dynamic_graphs = True
    for m in model.modules():
        if isinstance(m, Transformer):
            m.checkpointing = train.activation_checkpointing
        if compiled and isinstance(m, Block):
            m.compile(mode=None if train.compile_mode == "default" else train.compile_mode, dynamic=None)
    model.cuda_graphs = compiled and device.type == "cuda" and "reduce-overhead" in train.compile_mode
    # A compiled step marks varying lengths dynamic and aligns them (coreecg.model.encoder); eager
    # steps skip both: the padding to a multiple of 8 and the always-built mask cost 4-5 % on the CPU.
    model.compiled = compiled
    return model
