"""Figures: the paper's reconstruction figure (original vs reconstructed signal, masked patches
shaded). One implementation, used by the in-loop figure and `jobs/figures.py`."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from coreecg.config import STANDARD_LEADS

# Lazy imports: matplotlib and scikit-learn (the `ray` extra), where a figure is drawn: the training modules
# import this module without them, so the plan's preflight names the extra; and the figure backend (Agg) is
# chosen only where this module draws. Measured: pyplot 1,178 -> 1,353 modules (0.35 s), t-SNE +1,343 (0.95 s).


def reconstruction_figure(model, windows: torch.Tensor, seed: int = 0, title: str = ""):
    """A matplotlib Figure: one row per lead; one column per window, or, for several models
    ({label: model}), one column per (window, model), side by side on the same windows and the
    same masks (the first model draws them). Blue: the original (cropped, z-scored) signal; red:
    the Time Decoder's output on masked patches; grey shading: masked patches (the loss lives
    there); hatched: dropped patches (never supervised). The masks come from a generator seeded
    with `seed`, so figures of one run at different epochs show the same windows under the same
    masks.

    model: a CoReECG (its `reconstruct`) or {label: CoReECG}; windows: (W, C, T) with
    T = model.input_samples.
    """
    import matplotlib
    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt

    models = dict(model) if isinstance(model, dict) else {"": model}
    x, outputs, masked, dropped = _reconstructions(models, windows, seed)
    W, C, T = x.shape
    N, P = next(iter(outputs.values())).shape[2:]
    t = np.arange(N * P)
    cols = [(w, label) for w in range(W) for label in models]
    fig, axes = plt.subplots(C, len(cols), figsize=(5.5 * len(cols), 0.9 * C + 0.8), sharex=True, squeeze=False)
    for j, (w, label) in enumerate(cols):
        recon = outputs[label]
        for c in range(C):
            ax = axes[c, j]
            for n in range(N):
                if masked[w, c, n]:
                    ax.axvspan(n * P, (n + 1) * P, color="0.88", lw=0)
                elif dropped[w, c, n]:
                    ax.axvspan(n * P, (n + 1) * P, facecolor="none", edgecolor="0.75", hatch="///", lw=0)
            ax.plot(t, x[w, c, : N * P], color="tab:blue", lw=0.7)
            shown = np.where(np.repeat(masked[w, c], P), recon[w, c].reshape(-1), np.nan)
            ax.plot(t, shown, color="tab:red", lw=0.7)
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(STANDARD_LEADS[c] if C == len(STANDARD_LEADS) else str(c), rotation=0,
                              ha="right", va="center", fontsize=8)
        axes[0, j].set_title(f"{label}, window {w}" if label else f"window {w}", fontsize=9)
        axes[-1, j].set_xlabel("sample (250 Hz)")
    fig.suptitle(title or "original (blue), reconstruction of masked patches (red); "
                 "grey: masked, hatched: dropped", fontsize=9)
    fig.tight_layout()
    return fig


def _reconstructions(models: dict, windows: torch.Tensor, seed: int
                     ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Each model's reconstruction of `windows` (W, C, T) under the same masks, drawn by the first
    model from a generator seeded with `seed`, each model in eval mode meanwhile -> (the windows
    (W, C, T), {label: reconstruction (W, C, N, P)}, masked (W, C, N) bool, dropped (W, C, N) bool)."""
    first = next(iter(models.values()))
    device = next(first.parameters()).device
    gen = torch.Generator(device).manual_seed(seed)
    x = windows.to(device, torch.float32)
    outputs, masks = {}, None
    for label, m in models.items():
        was_training = m.training
        m.eval()
        recon, *drawn = m.reconstruct(x.to(next(m.parameters()).device), gen, masks=masks)
        m.train(was_training)
        masks = masks or tuple(drawn)
        outputs[label] = recon.float().cpu().numpy()
    return x.cpu().numpy(), outputs, masks[1].cpu().numpy(), masks[2].cpu().numpy()


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
    return tsne_panels([(title, features)], multihot, class_names, multilabel, seed, max_points)


def _check_panels(xs: list[np.ndarray], y: np.ndarray, class_names: Sequence[str], max_points: int) -> None:
    """ValueError unless every panel's features (n, D) match multihot (n, K), K class names, and
    there are at least 5 points to show."""
    for x in xs:
        if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
            raise ValueError(f"features (n, D) and multihot (n, K) must match, got {x.shape} and {y.shape}")
    if y.shape[1] != len(class_names):
        raise ValueError(f"{len(class_names)} class names for {y.shape[1]} label columns")
    if len(y) < 5 or max_points < 5:
        raise ValueError(f"t-SNE needs at least 5 points (got {len(y)}, max_points={max_points})")


def _class_colours(plt, k: int):
    """k colours: qualitative maps keep neighbouring classes distinguishable; a continuous map only
    past 20 classes. plt: matplotlib.pyplot, imported by the caller."""
    if k <= 10:
        return plt.get_cmap("tab10").colors[:k]
    if k <= 20:
        return plt.get_cmap("tab20").colors[:k]
    return plt.get_cmap("turbo")(np.linspace(0.05, 0.95, k))


def tsne_panels(panels: Sequence[tuple[str, np.ndarray]], multihot: np.ndarray, class_names: Sequence[str],
                multilabel: bool, seed: int = 0, max_points: int = 2000, title: str = ""):
    """Side-by-side t-SNE panels of several encoders' embeddings of the SAME records (e.g. ST-MEM
    vs CoRe-ECG on one test set): the same points, colours and subset in every panel, so the
    panels differ only by the encoder. panels: [(panel title, features (n, D))]; the rest as
    `tsne_figure`."""
    import matplotlib
    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE
    from sklearn.preprocessing import StandardScaler

    y = np.asarray(multihot)
    xs = [np.asarray(f, dtype=np.float64) for _, f in panels]
    _check_panels(xs, y, class_names, max_points)
    n_all = len(y)
    labels = tsne_labels(y, multilabel)
    keep = _subsample(labels, max_points, seed) if n_all > max_points else np.arange(n_all)
    labels = labels[keep]
    n = len(keep)
    K = len(class_names)
    colours = _class_colours(plt, K)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels) + 2.0, 5.5), layout="constrained",
                             squeeze=False)  # constrained: room for the legend
    what = "coloured by the most frequent positive label" if multilabel else "coloured by class"
    shown = f"{n} of {n_all} shown" if n < n_all else f"{n} points"
    for ax, (panel_title, _), x in zip(axes[0], panels, xs):
        x = StandardScaler().fit_transform(x[keep])
        # sklearn uses 3 * perplexity + 1 neighbours, at most n - 1: so tiny sets still work
        z = TSNE(n_components=2, init="pca" if x.shape[1] >= 2 else "random", random_state=seed,
                 perplexity=min(30.0, (n - 1) / 3), learning_rate="auto").fit_transform(x)   # (n, 2)
        none = labels < 0
        if none.any():   # first, so class colours are drawn on top of the grey
            ax.scatter(z[none, 0], z[none, 1], s=6, color="0.75", lw=0, label=f"no label ({none.sum()})")
        for k in range(K):   # one scatter per class: the legend names the class with its count
            sel = labels == k
            if sel.any():
                ax.scatter(z[sel, 0], z[sel, 1], s=6, color=colours[k], lw=0,
                           label=f"{class_names[k]} ({sel.sum()})")
        ax.set_xticks([])   # t-SNE axes carry no meaning
        ax.set_yticks([])
        header = [panel_title] if len(panels) > 1 else [panel_title or title]
        ax.set_title("\n".join(filter(None, [*header, f"t-SNE of embeddings, {what} ({shown})"])), fontsize=9)
    axes[0, -1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, markerscale=2.0, frameon=False,
                       ncol=1 if K <= 25 else 2)
    if len(panels) > 1 and title:
        fig.suptitle(title, fontsize=10)
    return fig


def layer_probe_figure(result: dict):
    """The per-layer probes of `coreecg.eval.layer_probe.probe_layers`'s result: test macro AUROC
    per layer (x: the block, 1-based) with its patient-bootstrap 95 % interval, val AUROC dashed,
    the layer chosen by val marked; a regression task's result: test MAE (in the target's unit)
    the same way (lower is better)."""
    import matplotlib
    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt

    rows = result["layers"]
    layer = np.array([r["layer"] for r in rows])
    num = np.vectorize(lambda v: np.nan if v is None else float(v), otypes=[float])
    metric = "mae" if result.get("metric") == "mae" else "auroc"
    test, val = num([r[f"test_{metric}"] for r in rows]), num([r[f"val_{metric}"] for r in rows])
    low, high = num([r["low"] for r in rows]), num([r["high"] for r in rows])
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * len(rows) + 2.5), 3.4))
    ax.errorbar(layer, test, yerr=np.nan_to_num([test - low, high - test]), fmt="o-", capsize=3,
                label="test (95 % CI, patient bootstrap)")
    ax.plot(layer, val, "s--", color="grey", alpha=0.7, label="val")
    best = result["best_layer"]
    ax.axvline(best, color="tab:red", linestyle=":", label=f"best by val: layer {best}")
    ax.set_xlabel("layer (block)")
    unit = (result.get("task") or {}).get("unit")
    ax.set_ylabel("macro AUROC" if metric == "auroc" else
                  f"MAE{f' ({unit})' if unit else ''}, lower is better")
    ax.set_xticks(layer)
    ax.set_title(f"linear probe per layer: {Path(result['corpus']).name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
