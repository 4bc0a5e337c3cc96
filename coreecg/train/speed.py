"""Speed and memory options of a training step (docs/performance.md). None changes the numbers
beyond float rounding (tests/test_step_numerics.py).

Host memory. A CPU training step frees and re-allocates the same large activation buffers
every step; glibc's malloc serves blocks above 32 MB with mmap and returns them on free, so
each step would pay page faults and the zero-filling of fresh pages again. Serving every block
from the heap and never trimming it keeps the pages (the figures: docs/performance.md). The
process keeps its peak footprint between steps, which it reaches every step anyway.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import shutil
import sys

import torch
from torch import nn

try:        # torch's own Triton check (a private module: a torch without it has no Triton for us)
    from torch.utils._triton import has_triton
except ImportError:
    has_triton = None

from coreecg.config import TrainConfig
from coreecg.config.sections import AUTO
from coreecg.model.layers import Block, Transformer

log = logging.getLogger(__name__)
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


def graphs_compiled() -> int:
    """Graphs torch.compile has built in this process so far (dynamo's own count; 0 when nothing is
    compiled). The loop records how many were built after a run's first step: 0 is the goal.
    Read only where dynamo is loaded (torch.compile loads it): an eager run does not pay its import
    (0.8 s here) for a count that is 0."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0


@contextlib.contextmanager
def uncompiled(model: nn.Module):
    """Run `model`'s compiled blocks eagerly inside (torch.compiler.set_stance("force_eager"),
    torch >= 2.6; a no-op for an eager model or an older torch). The loop evaluates this way
    (the probe at init and between epochs, fine-tuning's validation and test): evaluation's
    shapes (no grad, the probe's or validation's batch) would otherwise build graphs of their own,
    before the first step at init (the quickstart compiled on the CPU: 14.4 s for the probe at
    init, 6.2 s eager, the same probe_auroc_init) and again between epochs, for passes that are a
    small share of a run."""
    if not getattr(model, "compiled", False) or not hasattr(torch.compiler, "set_stance"):
        yield
        return
    with torch.compiler.set_stance("force_eager"):
        yield


def compile_enabled(train: TrainConfig, device: torch.device) -> bool:
    """train.compile on `device`: a set true/false is kept; auto compiles on CUDA only. On a GPU
    the compiled step fuses the memory-bound kernels between the matmuls and attention (most of
    an eager step's device time); on the CPU it costs its compile time and buys nothing
    (docs/performance.md, docs/decisions.md "Compiled step")."""
    if train.compile == AUTO:
        device = torch.device(device)
        return device.type == "cuda" and inductor_supports(device)
    return bool(train.compile)


def inductor_supports(device: torch.device) -> bool:
    """Whether inductor can compile for this CUDA device: Triton (torch's own check), this GPU of
    compute capability 7.0 or newer, and a C compiler, which Triton needs to build its launchers
    at the first step (a slim CUDA image may have none). Where one is missing
    `auto` stays eager rather than failing at the first step; a set train.compile=true still tries
    (and torch says why it cannot)."""
    if has_triton is None:
        return False
    compiler = any(shutil.which(c) for c in (os.environ.get("CC", ""), "cc", "gcc", "clang") if c)
    return compiler and has_triton() and torch.cuda.get_device_capability(device)[0] >= 7


def apply_speed_options(model: nn.Module, train: TrainConfig) -> nn.Module:
    """Set a model's speed/memory options from `train` (in place; returns the model).

    - train.host_memory_cache (CPU): keep_freed_memory().
    - train.activation_checkpointing: every Transformer recomputes its blocks in backward
      instead of keeping their activations (about a block's input per token kept instead of
      ~16 widths; one more forward of each block).
    - train.compile (compile_enabled: auto = on CUDA): each transformer Block compiled with torch.compile in
      train.compile_mode (regional: every Block of a width shares one graph, so compile time does
      not grow with depth). Every graph is built in the first step: a varying sequence length
      (bernoulli STDM) is marked dynamic where it arises (model.layers.Transformer), so nothing
      recompiles later (tests/test_compile_once.py). "reduce-overhead" replays CUDA graphs for
      every graph, the dynamic-length ones included: one CUDA graph is recorded per distinct length
      met (bernoulli STDM's 8-aligned visible lengths: a handful at a worker batch of 256, more at
      small batches), a recording, not a compilation. Graphing only the fixed-shape graphs would
      leave and re-enter the graphs around every un-graphed block, which is slower
      (docs/performance.md).
    """
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    if train.host_memory_cache and device.type == "cpu":
        keep_freed_memory()
    compiled = compile_enabled(train, device)
    if train.compile == AUTO and device.type == "cuda" and not compiled:
        log.warning("train.compile=auto: inductor cannot compile for %s here (it needs Triton, compute capability "
                    ">= 7.0 and a C compiler); the step runs eager", torch.cuda.get_device_name(device))
    if compiled:
        # One graph per (width, grad mode, mask or not, layout): the paper's model makes ~8 in a
        # run with its probe, torch's default limit; past it dynamo would silently run eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        # reduce-overhead: graph every block, the dynamic-length ones per length (docstring)
        torch._inductor.config.triton.cudagraph_skip_dynamic_graphs = False
    blocks = 0
    for m in model.modules():
        if isinstance(m, Transformer):
            m.checkpointing = train.activation_checkpointing
        if compiled and isinstance(m, Block):
            m.compile(mode=None if train.compile_mode == "default" else train.compile_mode, dynamic=None)
            blocks += 1
    compiled = compiled and blocks > 0       # a model of other blocks (the ST-MEM adapter) stays eager
    model.cuda_graphs = compiled and device.type == "cuda" and "reduce-overhead" in train.compile_mode
    # A compiled step marks varying lengths dynamic and aligns them (coreecg.model.encoder); eager
    # steps skip both: the padding to a multiple of 8 and the always-built mask cost 4-5 % on the CPU.
    model.compiled = compiled
    return model
