"""t-SNE figure of embeddings: colour classes, legend, subsampling, determinism."""
import numpy as np
import pytest

from coreecg.eval.figures import save_figure, tsne_figure, tsne_labels

NAMES = ["NORM", "MI", "STTC", "CD", "HYP"]


def _data(n=60, D=8, seed=0):
    """n points in D dims, 3 separated clusters labelled NORM / MI / STTC (CD, HYP never positive)."""
    rng = np.random.default_rng(seed)
    cls = np.arange(n) % 3
    x = rng.normal(size=(n, D)) + 6.0 * np.eye(3, D)[cls]
    y = np.zeros((n, len(NAMES)), dtype=np.int64)
    y[np.arange(n), cls] = 1
    return x, y


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt
    plt.close("all")


def _legend(fig):
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_tsne_labels_single_label():
    y = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 1]])
    assert tsne_labels(y, multilabel=False).tolist() == [1, 0, -1, 2]


def test_tsne_labels_multilabel_most_frequent_positive():
    y = np.array([[1, 1, 0, 0],    # 1 (4 in the set) beats 0 (2)
                  [1, 0, 1, 0],    # 2 (3) beats 0 (2), although 0 comes first
                  [0, 1, 1, 0],    # 1
                  [0, 0, 0, 1],    # only 3: rare, still its own colour
                  [0, 0, 0, 0],    # none -> -1
                  [0, 1, 0, 0],
                  [0, 1, 1, 1]])   # 1 over 2 and 3
    assert y.sum(0).tolist() == [2, 4, 3, 2]
    assert tsne_labels(y, multilabel=True).tolist() == [1, 2, 1, 3, -1, 1, 1]
    assert tsne_labels(y, multilabel=False)[1] == 0     # single-label: just the positive (first) class
    tie = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1]])   # 0 and 1 both twice: lowest index
    assert tsne_labels(tie, multilabel=True).tolist() == [0, 0, 2]


def test_tsne_figure_legend_names_present_classes_only(tmp_path):
    x, y = _data()
    y[:4] = 0                               # 4 points with no label -> grey entry
    fig = tsne_figure(x, y, NAMES, multilabel=False, title="run A")
    texts = _legend(fig)
    for name in ("NORM", "MI", "STTC"):
        assert any(t.startswith(name + " (") for t in texts), texts
    assert not any(t.startswith(("CD", "HYP")) for t in texts), texts
    assert "no label (4)" in texts
    counts = sum(int(t.rsplit("(", 1)[1].rstrip(")")) for t in texts)
    assert counts == 60
    title = fig.axes[0].get_title()
    assert title.startswith("run A") and "of 60 shown" not in title and "60 points" in title
    ax = fig.axes[0]
    assert len(ax.get_xticks()) == 0 and len(ax.get_yticks()) == 0
    assert sum(len(c.get_offsets()) for c in ax.collections) == 60
    out = save_figure(fig, tmp_path / "tsne.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tsne_figure_subsamples_and_says_so():
    x, y = _data(n=90)
    fig = tsne_figure(x, y, NAMES, multilabel=True, max_points=30)
    title = fig.axes[0].get_title()
    assert "30 of 90 shown" in title and "most frequent positive label" in title
    offsets = [c.get_offsets() for c in fig.axes[0].collections]
    assert sum(len(o) for o in offsets) == 30
    assert sorted(len(o) for o in offsets) == [10, 10, 10]   # stratified: each class keeps its third


def test_tsne_figure_deterministic_for_a_seed():
    x, y = _data()
    a = tsne_figure(x, y, NAMES, multilabel=False, seed=3)
    b = tsne_figure(x, y, NAMES, multilabel=False, seed=3)
    assert len(a.axes[0].collections) == len(b.axes[0].collections) == 3
    for ca, cb in zip(a.axes[0].collections, b.axes[0].collections):
        np.testing.assert_array_equal(ca.get_offsets(), cb.get_offsets())
    # scale-free: standardised features give the same picture
    c = tsne_figure(x * 1000.0, y, NAMES, multilabel=False, seed=3)
    for ca, cc in zip(a.axes[0].collections, c.axes[0].collections):
        np.testing.assert_allclose(ca.get_offsets(), cc.get_offsets(), atol=1e-6)


def test_tsne_figure_tiny_and_too_small():
    x, y = _data(n=5)
    fig = tsne_figure(x, y, NAMES, multilabel=False)    # perplexity shrinks to fit 5 points
    assert sum(len(c.get_offsets()) for c in fig.axes[0].collections) == 5
    with pytest.raises(ValueError, match="at least 5 points"):
        tsne_figure(x[:4], y[:4], NAMES, multilabel=False)
