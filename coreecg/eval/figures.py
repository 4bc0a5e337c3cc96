"""Figures: the paper's reconstruction figure (original vs reconstructed signal, masked patches
shaded). One implementation, used by the in-loop figure and `jobs/figures.py`."""
from __future__ import annotations

from collections.abc import Sequence
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


def tsne_labels(multihot: np.ndarray, multilabel: bool) -> np.ndarray:
    """(n, K) {0,1} -> (n,) int colour class: single-label: the positive class; multi-label: among a
    sample's positive labels the one most frequent in the whole set (ties: lowest index); -1 if none.

    One colour per point is all a scatter can show; the most frequent positive label keeps
    the big classes' structure visible instead of scattering it over rare co-labels.
    """
    y = np.asarray(multihot)
    if y.ndim != 2:
        raise ValueError(f"multihot must be (n, K), got shape {y.shape}")
    pos = y > 0
    if multilabel:
        freq = pos.sum(axis=0)                              # (K,) positives per class, whole set
        score = np.where(pos, freq[None, :], -1)            # (n, K); argmax takes the first max: lowest index
    else:
        score = pos.astype(np.int64)                        # (n, K); the positive class (first if several)
    out = np.argmax(score, axis=1).astype(np.int64) if y.shape[1] else np.zeros(len(y), np.int64)
    out[~pos.any(axis=1)] = -1
    return out


def _subsample(labels: np.ndarray, max_points: int, seed: int) -> np.ndarray:
    """Sorted indices of max_points of len(labels) points: a seeded shuffle, grouped by label,
    then evenly spaced picks, so each class keeps about its share (rare classes do not vanish
    by chance) and the choice is the same for one seed."""
    perm = np.random.default_rng(seed).permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]  # classes in blocks, shuffled within
    picks = np.linspace(0, len(labels) - 1, max_points).round().astype(np.int64)  # spacing >= 1: distinct
    return np.sort(order[picks])


def tsne_figure(features: np.ndarray, multihot: np.ndarray, class_names: Sequence[str], multilabel: bool,
                seed: int = 0, max_points: int = 2000, title: str = ""):
    """t-SNE (scikit-learn) of embeddings (n, D) coloured by class; returns a matplotlib Figure
    (save it with `save_figure`).

    features: (n, D); multihot: (n, K) {0,1}; class_names: K names. The colour of a point is
    `tsne_labels(multihot, multilabel)` (computed on all n points); grey: no positive label.
    Features are standardised first, so the embedding's scale does not matter. Above
    max_points points a seeded, class-stratified subset is shown ("m of n shown" in the title).
    Same inputs and seed give the same figure. Raises ValueError for fewer than 5 points.
    """
    import matplotlib
    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(multihot)
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
        raise ValueError(f"features (n, D) and multihot (n, K) must match, got {x.shape} and {y.shape}")
    if y.shape[1] != len(class_names):
        raise ValueError(f"{len(class_names)} class names for {y.shape[1]} label columns")
    n_all = len(x)
    if n_all < 5 or max_points < 5:
        raise ValueError(f"t-SNE needs at least 5 points (got {n_all}, max_points={max_points})")
    labels = tsne_labels(y, multilabel)
    if n_all > max_points:
        keep = _subsample(labels, max_points, seed)
        x, labels = x[keep], labels[keep]
    n = len(x)

    x = StandardScaler().fit_transform(x)
    # sklearn uses 3 * perplexity + 1 neighbours, at most n - 1: so tiny sets still work
    tsne = TSNE(n_components=2, init="pca" if x.shape[1] >= 2 else "random", random_state=seed,
                perplexity=min(30.0, (n - 1) / 3), learning_rate="auto")
    z = tsne.fit_transform(x)                               # (n, 2)

    K = len(class_names)
    # qualitative maps keep neighbouring classes distinguishable; a continuous map only past 20
    if K <= 10:
        colours = plt.get_cmap("tab10").colors[:K]
    elif K <= 20:
        colours = plt.get_cmap("tab20").colors[:K]
    else:
        colours = plt.get_cmap("turbo")(np.linspace(0.05, 0.95, K))
    fig, ax = plt.subplots(figsize=(8.0, 5.5), layout="constrained")  # constrained: room for the legend
    none = labels < 0
    if none.any():   # first, so class colours are drawn on top of the grey
        ax.scatter(z[none, 0], z[none, 1], s=6, color="0.75", lw=0, label=f"no label ({none.sum()})")
    for k in range(K):   # one scatter per class: the legend names the class with its count
        sel = labels == k
        if sel.any():
            ax.scatter(z[sel, 0], z[sel, 1], s=6, color=colours[k], lw=0, label=f"{class_names[k]} ({sel.sum()})")
    ax.set_xticks([])   # t-SNE axes carry no meaning
    ax.set_yticks([])
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, markerscale=2.0, frameon=False,
              ncol=1 if K <= 25 else 2)
    what = "coloured by the most frequent positive label" if multilabel else "coloured by class"
    shown = f"{n} of {n_all} shown" if n < n_all else f"{n} points"
    ax.set_title("\n".join(filter(None, [title, f"t-SNE of embeddings, {what} ({shown})"])), fontsize=9)
    return fig
