"""Analytic matmul FLOPs of pretraining, per sample, for every built-in method (no measurement,
just arithmetic)."""
from __future__ import annotations

from coreecg.config import Config


def transformer_flops(tokens: float, dim: int, depth: int, mlp_ratio: float, seq_len: float | None = None) -> float:
    """Forward FLOPs of `depth` pre-norm blocks on `tokens` tokens (2 per multiply-add), the
    tokens attending within sequences of `seq_len` (default: one sequence of all of them)."""
    seq_len = tokens if seq_len is None else seq_len
    linear = 2 * tokens * dim * dim * (4 + 2 * mlp_ratio)      # qkv (3), out proj (1), MLP (2r)
    attention = 4 * tokens * seq_len * dim                       # QK^T and AV
    return depth * (linear + attention)


def decoder_flops(layout: str, n_leads: int, n_patches: int, dim: int, depth: int, mlp_ratio: float) -> float:
    """A grid decoder's transformer: joint attends over all C * N tokens, lead within each lead
    (N), axial alternates within-lead (N, even blocks) and within-column (C, odd blocks)."""
    grid = n_leads * n_patches
    if layout == "joint":
        return transformer_flops(grid, dim, depth, mlp_ratio)
    if layout == "lead":
        return transformer_flops(grid, dim, depth, mlp_ratio, n_patches)
    lead_blocks = (depth + 1) // 2
    return (transformer_flops(grid, dim, lead_blocks, mlp_ratio, n_patches)
            + transformer_flops(grid, dim, depth - lead_blocks, mlp_ratio, n_leads))


def pretrain_flops_per_sample(cfg: Config) -> dict[str, float]:
    """Forward and training FLOPs per sample of `cfg.pretrain.method` (CoRe-ECG below; MoCo v3 and
    CMSC in `_baseline_flops`), counting the expected visible tokens of STDM.

    Training = 3x forward for everything the optimiser updates (forward + 2x backward), and
    2x forward for the frozen teacher when W learns (forward + input-gradient backward), 1x
    when it does not. Padding in bernoulli STDM is *not* counted: it is overhead, not work.
    """
    if cfg.pretrain.method != "core":
        return _baseline_flops(cfg)
    m, k = cfg.model, cfg.masking
    C, N, P = m.n_leads, m.n_patches, m.patch_size
    grid = C * N
    if k.strategy == "stdm":
        visible = (1 - k.p_time) * N * k.k
    elif k.strategy == "random":
        visible = grid - round(k.ratio * grid)
    elif k.strategy == "temporal":
        visible = C * (N - round(k.ratio * N))
    else:
        visible = N * (C - round(k.ratio * C))
    patch = 2 * grid * P * m.embed_dim
    student = patch + transformer_flops(visible, m.embed_dim, m.depth, m.mlp_ratio)
    parts = {"student_encoder": student}
    if cfg.loss.alpha > 0:
        parts["time_decoder"] = (2 * visible * m.embed_dim * m.time_decoder_dim
                                 + decoder_flops(m.time_decoder_layout, C, N, m.time_decoder_dim,
                                                 m.time_decoder_depth, m.mlp_ratio)
                                 + 2 * grid * m.time_decoder_dim * P)
    if cfg.loss.beta > 0:
        proj = 2 * (m.embed_dim * m.proj_hidden_dim + m.proj_hidden_dim * m.proj_dim)
        parts["latent_decoder"] = (2 * visible * m.embed_dim * m.latent_decoder_dim
                                   + decoder_flops(m.latent_decoder_layout, C, N, m.latent_decoder_dim,
                                                   m.latent_decoder_depth, m.mlp_ratio)
                                   + proj)
        parts["teacher"] = patch + transformer_flops(grid, m.embed_dim, m.depth, m.mlp_ratio) + proj
    forward = sum(parts.values())
    teacher = parts.get("teacher", 0.0)
    teacher_factor = 2 if (cfg.augment.fda and cfg.augment.learnable) else 1
    train = 3 * (forward - teacher) + teacher_factor * teacher
    return {**{f"forward_{k}": v for k, v in parts.items()}, "forward": forward, "train_step": train}


def _mlp_flops(layers: int, in_dim: int, hidden: int, out_dim: int) -> float:
    dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
    return sum(2 * a * b for a, b in zip(dims, dims[1:]))


def _baseline_flops(cfg: Config) -> dict[str, float]:
    """MoCo v3: two views through the query path (encoder, projector, predictor: trained, 3x) and
    the key path (momentum encoder, projector: forward only, 1x). CMSC: `segments` segments of
    C * N / segments tokens each through the encoder and its linear head (3x)."""
    m = cfg.model
    grid = m.n_leads * m.n_patches
    patch = 2 * grid * m.patch_size * m.embed_dim
    if cfg.pretrain.method == "moco_v3":
        o = cfg.methods.moco_v3
        encoder = patch + transformer_flops(grid, m.embed_dim, m.depth, m.mlp_ratio)
        projector = _mlp_flops(o.proj_layers, m.embed_dim, o.hidden_dim, o.dim)
        query = 2 * (encoder + projector + _mlp_flops(o.pred_layers, o.dim, o.hidden_dim, o.dim))
        key = 2 * (encoder + projector)
        return {"forward_query": query, "forward_key": key, "forward": query + key, "train_step": 3 * query + key}
    if cfg.pretrain.method == "cmsc":
        o = cfg.methods.cmsc
        tokens = grid // o.segments
        one = transformer_flops(tokens, m.embed_dim, m.depth, m.mlp_ratio) + 2 * m.embed_dim * o.dim
        forward = o.segments * one + o.segments * patch        # the patch conv runs on the whole crop per segment
        return {"forward_segments": forward, "forward": forward, "train_step": 3 * forward}
    raise ValueError(f"no FLOP count for pretrain.method={cfg.pretrain.method!r}")
