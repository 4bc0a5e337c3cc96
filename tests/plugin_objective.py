"""A sweep objective outside coreecg, one module (docs/sweeps.md shows it): the share of the probe
corpus's variance in the embeddings' first principal direction, to be minimised (a representation
that spreads its variance is less collapsed)."""
import numpy as np

from coreecg.eval.objectives import Embeddings, register_objective


@register_objective("top_pc_share", "min", "variance share of the first principal direction")
def top_pc_share(e: Embeddings) -> dict[str, float]:
    x = np.concatenate([e.train_x, e.val_x])
    s = np.linalg.svd(x - x.mean(0), compute_uv=False) ** 2
    return {"top_pc_share": float(s[0] / s.sum()) if s.sum() > 0 else 1.0}
