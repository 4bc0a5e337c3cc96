"""The compiled feature pass of an inference path (`inference.compile`, docs/inference.md "Compiled").

torch.compile (inductor) of the model's `features`, its weights frozen into the graph (inductor's
`freezing`: matrix weights prepacked for oneDNN, bias and GELU fused into the products, constants
folded). What it gains depends on the model and the processor (docs/performance.md "CPU
inference, compiled": xresnet1d 1.17x, the ViT 0.9-1.2x, S4 0.8x on one Xeon with AMX), and a
compilation takes 8-60 s, so `auto` compiles only a run long enough to win it back and then
keeps whichever of the compiled and the eager pass its own first passes time faster
(`keep_compiled`). Every forward pass has the same shape (the engine fills the last one), so
one graph serves a run; the engine checks the compiled outputs against the eager ones on the
first pass and goes on eagerly, saying why, when the compiler fails or the outputs differ past
the bounds.
"""
from __future__ import annotations

from typing import Sequence

import pyarrow.parquet as pq
import torch
from torch import nn

from coreecg.config.sections import InferenceConfig
from coreecg.inference.items import CorpusShard


class CompiledFeatures(nn.Module):
    """`model` (a Classifier or a PooledEncoder, eval, prepared for its precision) seen through
    the methods `coreecg.eval.downstream.predict` calls, with `features` compiled: (B, C, T) -> (B, D).
    The weights are frozen into the graph: a later change to them is not seen (the engine builds
    one per prepared model, and a prepared model's weights do not change)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.inner = model
        self._features = torch.compile(model.features, dynamic=False, options={"freezing": True})

    @property
    def encoder(self) -> nn.Module:
        return self.inner.encoder

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self._features(x)

    def head(self, f: torch.Tensor) -> torch.Tensor:
        return self.inner.head(f)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return self.inner.probabilities(logits)


# auto's trial: passes timed of each of the compiled and the eager pass, alternating, before it keeps one
TRIAL_PASSES = 3
EAGER, COMPILED, MEASURED = "eager", "compiled", "measured"


def windows_ahead(items: Sequence) -> int:
    """The fewest windows a run of `items` scores: a listed file or an in-memory record at least one,
    a corpus shard its stored windows (its Parquet footer's row count; no signal is read)."""
    return sum(pq.read_metadata(it.path).num_rows if isinstance(it, CorpusShard) else 1 for it in items)


def compile_choice(config: InferenceConfig, device: torch.device, precision: str, windows: int) -> tuple[str, str]:
    """How a run of at least `windows` windows (windows_ahead) on `device` in `precision` runs its
    feature pass -> (mode, why):
    EAGER, COMPILED (inference.compile=true) or MEASURED (auto on a long CPU run: compiled, then
    the faster of compiled and eager over the first passes)."""
    if config.compile is False:
        return EAGER, "eager (inference.compile=false)"
    if precision == "int8":
        return EAGER, "eager: the int8 path (dynamic quantisation) is not compiled"
    if config.compile is True:
        return COMPILED, "compiled (inference.compile=true)"
    if device.type != "cpu":
        return EAGER, f"eager: inference.compile=auto compiles on a CPU only (this run: {device.type})"
    if windows < config.compile_min_windows:
        return EAGER, (f"eager: {windows} windows, under inference.compile_min_windows={config.compile_min_windows} "
                       "(a compilation takes 8-60 s)")
    return MEASURED, (f"{windows} windows (inference.compile=auto, at least {config.compile_min_windows}): compiled, "
                      f"then the faster of compiled and eager over {TRIAL_PASSES} passes each")


def keep_compiled(compiled_s: list[float], eager_s: list[float]) -> bool:
    """auto's verdict on its trial: the compiled pass is kept when its fastest pass beats the eager
    one's (the fastest: the least disturbed by other work on a shared machine)."""
    return min(compiled_s) < min(eager_s)


__all__ = ["COMPILED", "CompiledFeatures", "EAGER", "MEASURED", "TRIAL_PASSES", "compile_choice", "keep_compiled",
           "windows_ahead"]
