"""Padding of short records inside model inputs (docs/data_pipeline.md "Short records").

A record shorter than the stored window is stored with NaN after its real samples (the padding
marker, `coreecg.data.preprocess.PAD`). NaN travels with the batch up to the model, so no
interface changes; every model entry point (the encoder, the pretraining methods) derives the
padding from it and replaces it by 0 before any arithmetic:

- a patch is padding when ANY of its samples is NaN (a partly real patch at the end of the real
  part is padding too: at most patch_size - 1 real samples are given up, never a padded one used);
- `fill` sets NaN to 0 with `torch.where`, so the gradient of a padded input is exactly 0 and
  NaN never reaches a loss or a gradient.
Both are elementwise kernels on the tensor's device: no host sync, also on an all-valid batch.

`unpadded()`: a caller that knows on the host that its batches hold no padding (a training split
whose manifest counts no padded window: `coreecg.data.corpus.unpadded_split`) says so, and the
encoder then passes no key-padding mask to attention where no other padding exists (exact STDM:
every sample has as many visible tokens; the teacher's full sequence). Without a mask, PyTorch's
flash-attention kernel can run on CUDA (docs/performance.md, "GPU figures"); with one it cannot.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

_UNPADDED: contextvars.ContextVar[bool] = contextvars.ContextVar("coreecg_unpadded", default=False)


@contextlib.contextmanager
def unpadded(active: bool = True) -> Iterator[None]:
    """Within: the caller guarantees its inputs hold no padding (no NaN). A NaN that comes anyway
    is still set to 0 (`fill`), but its patches are attended to: the guarantee must come from the
    data (a manifest's count), never from a guess."""
    token = _UNPADDED.set(active)
    try:
        yield
    finally:
        _UNPADDED.reset(token)


def assumed_unpadded() -> bool:
    """True inside `unpadded()`."""
    return _UNPADDED.get()


def padding_mask(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """x: (B, C, T), NaN on padding -> (B, C, N) bool, True on padded patches (N = T // patch_size)."""
    B, C, T = x.shape
    N = T // patch_size
    return torch.isnan(x[..., : N * patch_size]).reshape(B, C, N, patch_size).any(dim=-1)


def fill(x: torch.Tensor) -> torch.Tensor:
    """x with its padding (NaN) replaced by 0; the gradient at padded positions is 0."""
    return torch.where(torch.isnan(x), torch.zeros((), dtype=x.dtype, device=x.device), x)


def valid_samples(x: torch.Tensor) -> torch.Tensor:
    """(B, C, T) -> (B,) int64: real samples of each window (its padding is at the end, on every
    lead alike, so lead 0 says it)."""
    return (~torch.isnan(x[:, 0, :])).sum(dim=-1)


def sure_patches(config) -> int:
    """Leading patches of a training crop that are real signal whatever the record: a record of
    at least `min_duration_s` gives a crop whose first min(min_duration, crop) samples are real
    (short windows are cropped at offset 0, `ingest.to_model_input`)."""
    pre = config.data.preprocess
    real = min(int(pre.min_duration_s * pre.sampling_rate), config.model.input_samples)
    return max(1, real // config.patch_size)
