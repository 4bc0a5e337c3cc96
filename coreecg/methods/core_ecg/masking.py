"""CoRe-ECG's token masks over the (lead, time-patch) grid: STDM (the paper) and the ablation
masks, chosen by `methods.core.masking` (its strategy).

Every function returns three boolean tensors `(visible, masked, dropped)` of shape
(B, C, N) that partition the grid: each position is in exactly one of them.
visible -> the student encoder sees it; masked -> the Time Decoder must reconstruct it
(the loss lives here); dropped -> neither seen nor supervised (STDM only).

All sampling is batched on the device of the generator (or `device`); no Python loop
over samples, leads or patches.

A short record's padding (coreecg.model.padding) is applied after sampling, on the data's
device, by `exclude_padding`: a padded position is moved to `dropped` (neither seen nor
supervised), so the partition holds. Masks are drawn without it (on the host, no sync); the
encoder gathers by the drawn visible set and leaves padded tokens out of attention itself.
"""
from __future__ import annotations

import torch

from coreecg.methods.core_ecg.options import MaskingOptions
from coreecg.devices import to_device

Masks = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _device(generator: torch.Generator | None, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    return generator.device if generator is not None else torch.device("cpu")


def _rand(shape: tuple[int, ...], generator, device) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=device)


def _lowest_k(scores: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    """Boolean mask of the k smallest entries along `dim`: a uniform random k-subset when
    `scores` are i.i.d. uniform (ties have probability 0)."""
    idx = scores.topk(k, dim=dim, largest=False).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(dim, idx, True)


def stdm(batch_size: int, n_leads: int, n_patches: int, p_time: float, p_lead: float, k: int,
         generator: torch.Generator | None = None, mode: str = "bernoulli",
         device: torch.device | str | None = None, n_sure: int | None = None) -> Masks:
    """Spatio-Temporal Dual Masking (paper, Sec. STDM).

    Per sample and time index n: with probability p_time the whole column is masked
    (Step 1); otherwise exactly k leads stay visible, chosen uniformly, and each other
    lead is dropped with probability p_lead, else masked (Step 2).

    mode="bernoulli": the column mode is Bernoulli(p_time) as in the paper, so the number
        of visible tokens varies per sample (the encoder pads). A sample whose every
        column came out full-masked (probability p_time**N) gets one random column
        turned partial, so the student always sees something.
    mode="exact": exactly round(p_time * N) full-masked columns per sample, so every
        sample has (N - round(p_time * N)) * k visible tokens and needs no padding.
    n_sure: the first n_sure columns are real signal in every sample (a short record's padding
        can only follow them); the bernoulli rescue then makes sure one of THOSE is partial, so
        the student sees real signal (same random draws; n_sure = None or N: as before).

    Returns (visible, masked, dropped), bool, each (B, C, N).
    """
    if not 0 < k < n_leads:
        raise ValueError(f"k={k} visible leads needs 0 < k < n_leads={n_leads}")
    dev = _device(generator, device)
    B, C, N = batch_size, n_leads, n_patches
    if mode == "bernoulli":
        full = _rand((B, N), generator, dev) < p_time
        # Guard the all-full case without a per-sample loop: un-mask one random column.
        sure = N if n_sure is None else max(1, min(int(n_sure), N))
        all_full = full[:, :sure].all(dim=1, keepdim=True)
        scores = _rand((B, N), generator, dev)
        scores[:, sure:] = 2.0                                     # never rescue past the sure columns
        rescue = _lowest_k(scores, 1, dim=1)
        full = full & ~(all_full & rescue)
    elif mode == "exact":
        n_full = round(p_time * N)
        if n_full >= N:
            raise ValueError(f"exact STDM with p_time={p_time} masks all {N} columns")
        full = _lowest_k(_rand((B, N), generator, dev), n_full, dim=1) if n_full else \
            torch.zeros(B, N, dtype=torch.bool, device=dev)
    else:
        raise ValueError(f"unknown STDM mode {mode!r}; expected 'bernoulli' or 'exact'")

    full = full[:, None, :]                                        # (B, 1, N)
    keep = _lowest_k(_rand((B, C, N), generator, dev), k, dim=1)   # k visible leads per column
    visible = keep & ~full
    drop_draw = _rand((B, C, N), generator, dev) < p_lead
    dropped = drop_draw & ~keep & ~full
    masked = ~visible & ~dropped
    return visible, masked, dropped


def random_token_mask(batch_size: int, n_leads: int, n_patches: int, ratio: float,
                      generator: torch.Generator | None = None, device=None) -> Masks:
    """ST-MEM-style: exactly round(ratio * C * N) tokens masked per sample, uniformly."""
    dev = _device(generator, device)
    B, C, N = batch_size, n_leads, n_patches
    n_mask = min(round(ratio * C * N), C * N - 1)
    masked = _lowest_k(_rand((B, C * N), generator, dev), n_mask, dim=1).view(B, C, N)
    return ~masked, masked, torch.zeros_like(masked)


def _whole_axis_mask(batch_size: int, n_leads: int, n_patches: int, ratio: float, axis: int,
                     generator, device) -> Masks:
    """Mask exactly round(ratio * size) whole time columns (axis=2) or leads (axis=1) per sample."""
    dev = _device(generator, device)
    B, C, N = batch_size, n_leads, n_patches
    size = N if axis == 2 else C
    chosen = _lowest_k(_rand((B, size), generator, dev), min(round(ratio * size), size - 1), dim=1)
    masked = chosen.unsqueeze(3 - axis).expand(B, C, N).contiguous()
    return ~masked, masked, torch.zeros_like(masked)


def temporal_mask(batch_size: int, n_leads: int, n_patches: int, ratio: float,
                  generator: torch.Generator | None = None, device=None) -> Masks:
    """MTAE-like: exactly round(ratio * N) whole time columns masked per sample."""
    return _whole_axis_mask(batch_size, n_leads, n_patches, ratio, 2, generator, device)


def lead_mask(batch_size: int, n_leads: int, n_patches: int, ratio: float,
              generator: torch.Generator | None = None, device=None) -> Masks:
    """MLAE-like: exactly round(ratio * C) whole leads masked per sample."""
    return _whole_axis_mask(batch_size, n_leads, n_patches, ratio, 1, generator, device)


def make_masks(cfg: MaskingOptions, batch_size: int, n_leads: int, n_patches: int,
               generator: torch.Generator | None = None, device=None, n_sure: int | None = None) -> Masks:
    """Dispatch on `cfg.strategy`; the ablations are configurations, not code edits.
    n_sure: columns that are real signal in every sample (STDM bernoulli's rescue, see `stdm`)."""
    if cfg.strategy == "stdm":
        return stdm(batch_size, n_leads, n_patches, cfg.p_time, cfg.p_lead, cfg.k,
                    generator=generator, mode=cfg.mode, device=device, n_sure=n_sure)
    fn = {"random": random_token_mask, "temporal": temporal_mask, "lead": lead_mask}[cfg.strategy]
    return fn(batch_size, n_leads, n_patches, cfg.ratio, generator=generator, device=device)


def exclude_padding(masks: Masks, pad: torch.Tensor) -> Masks:
    """(visible, masked, dropped) with every padded position (pad (B, C, N) bool, True on a short
    record's padding) moved to `dropped`; on pad's device."""
    visible, masked, dropped = (to_device(m, pad.device) for m in masks)
    return visible & ~pad, masked & ~pad, dropped | pad
