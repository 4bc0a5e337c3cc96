"""Figures: the paper's reconstruction figure (original vs reconstructed signal, masked patches
shaded). One implementation, used by the in-loop figure and `jobs/figures.py`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from coreecg.config import STANDARD_LEADS


def reconstruction_figure(model: torch.nn.Module, windows: torch.Tensor, seed: int = 0, title: str = ""):
    """A matplotlib Figure: one column per window, one row per lead. Blue: the original
    (cropped, z-scored) signal; red: the Time Decoder's output on masked patches; grey
    shading: masked patches (the loss lives there); hatched: dropped patches (never
    supervised). The masks come from a generator seeded with `seed`, so figures of one run
    at different epochs show the same windows under the same masks.

    model: a CoReECG (its `reconstruct`); windows: (W, C, T) with T = model.input_samples.
    """
    import matplotlib
    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt

    device = next(model.parameters()).device
    gen = torch.Generator(device).manual_seed(seed)
    was_training = model.training
    model.eval()
    x = windows.to(device, torch.float32)
    recon, visible, masked, dropped = model.reconstruct(x, gen)
    model.train(was_training)
    W, C, T = x.shape
    N, P = recon.shape[2], recon.shape[3]
    x, recon = x.cpu().numpy(), recon.float().cpu().numpy()
    masked, dropped = masked.cpu().numpy(), dropped.cpu().numpy()
    t = np.arange(N * P)
    fig, axes = plt.subplots(C, W, figsize=(5.5 * W, 0.9 * C + 0.8), sharex=True, squeeze=False)
    for w in range(W):
        for c in range(C):
            ax = axes[c, w]
            for n in range(N):
                if masked[w, c, n]:
                    ax.axvspan(n * P, (n + 1) * P, color="0.88", lw=0)
                elif dropped[w, c, n]:
                    ax.axvspan(n * P, (n + 1) * P, facecolor="none", edgecolor="0.75", hatch="///", lw=0)
            ax.plot(t, x[w, c, : N * P], color="tab:blue", lw=0.7)
            shown = np.where(np.repeat(masked[w, c], P), recon[w, c].reshape(-1), np.nan)
            ax.plot(t, shown, color="tab:red", lw=0.7)
            ax.set_yticks([])
            if w == 0:
                ax.set_ylabel(STANDARD_LEADS[c] if C == len(STANDARD_LEADS) else str(c), rotation=0,
                              ha="right", va="center", fontsize=8)
        axes[0, w].set_title(f"window {w}", fontsize=9)
        axes[-1, w].set_xlabel("sample (250 Hz)")
    fig.suptitle(title or "original (blue), reconstruction of masked patches (red); "
                 "grey: masked, hatched: dropped", fontsize=9)
    fig.tight_layout()
    return fig


def save_figure(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
