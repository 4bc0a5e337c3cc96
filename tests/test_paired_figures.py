"""The paper's paired figures: two methods' reconstructions on the same windows and masks, and
two encoders' t-SNE panels of the same records."""
from __future__ import annotations

import numpy as np
import torch

from coreecg.eval.figures import reconstruction_figure, tsne_panels
from coreecg.methods import CoReECG
from tests.helpers import tiny_config


def test_two_methods_reconstruct_under_the_same_masks():
    torch.manual_seed(0)
    core = CoReECG(tiny_config())
    stmem = CoReECG(tiny_config("methods.core.masking.strategy=random", "methods.core.masking.ratio=0.75",
                                "methods.core.loss.beta=0"))
    x = torch.randn(2, 12, core.config.model.input_samples)
    gen = torch.Generator().manual_seed(3)
    recon, *masks = core.reconstruct(x, gen)
    again, *same = stmem.reconstruct(x, masks=tuple(masks))
    assert all(torch.equal(a, b) for a, b in zip(masks, same))          # given masks are used as they are
    assert recon.shape == again.shape and not torch.allclose(recon, again)
    fig = reconstruction_figure({"ST-MEM-like": stmem, "CoRe-ECG": core}, x, seed=3)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["ST-MEM-like, window 0", "CoRe-ECG, window 0", "ST-MEM-like, window 1", "CoRe-ECG, window 1"]
    # The shaded (masked) spans are the same in both methods' columns of one window.
    spans = [sorted(p.get_x() for p in ax.patches) for ax in fig.axes[:4]]   # lead I of the 4 columns
    assert spans[0] == spans[1] and spans[2] == spans[3] and len(spans[0]) > 0


def test_paired_tsne_panels_show_the_same_records_in_each_panel():
    rng = np.random.default_rng(0)
    y = np.eye(3)[rng.integers(0, 3, 60)]
    a, b = rng.normal(size=(60, 8)), rng.normal(size=(60, 8)) + 3 * y @ rng.normal(size=(3, 8))
    fig = tsne_panels([("ST-MEM-like", a), ("CoRe-ECG", b)], y, ["A", "B", "C"], False, seed=0, max_points=40)
    axes = [ax for ax in fig.axes if ax.collections]
    assert len(axes) == 2
    counts = [sorted(len(c.get_offsets()) for c in ax.collections) for ax in axes]
    assert counts[0] == counts[1] and sum(counts[0]) == 40           # one subset, same classes, both panels
    assert axes[0].get_title().startswith("ST-MEM-like") and axes[1].get_title().startswith("CoRe-ECG")
