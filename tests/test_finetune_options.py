"""Fine-tuning options (finetune.augment, layer_decay, head, linear_lr): the augmentation policy's
invariants (shape, padding, determinism, strength 0 = identity, training crops only), layer-wise
lr factors exactly as specified over every parameter once, the attention head in a trainable
classifier, the config's refusals and old configs loading, and one tiny run with every option on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from coreecg.train.augment import FINETUNE_OPS, ecg_randaugment
from coreecg.config import FINETUNE_AUGMENT_OPS, STANDARD_LEADS, ConfigError, load_config
from coreecg.model.classifier import Classifier
from coreecg.model.encoder import Encoder
from coreecg.train.optim import param_groups
from coreecg.train.step import FinetuneStep, Schedule
from tests.helpers import TINY, tiny_config


def _batch(seed: int = 0) -> torch.Tensor:
    x = torch.randn(8, 12, 2250, generator=torch.Generator().manual_seed(seed))
    x[0, :, 1800:] = float("nan")                   # a short record's padding
    return x


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------- augmentation


def test_every_op_keeps_shape_and_padding_stays_finite_and_changes_the_input():
    assert tuple(FINETUNE_OPS) == FINETUNE_AUGMENT_OPS
    x = _batch()
    pad = torch.isnan(x)
    for op in FINETUNE_AUGMENT_OPS:
        y = ecg_randaugment(x, [op], 1, 0.8, 1.0, _gen())
        assert y.shape == x.shape and y.dtype == x.dtype, op
        assert torch.equal(torch.isnan(y), pad), op                     # padding stays, nothing else is NaN
        assert not torch.equal(y[~pad], x[~pad]), op
        assert y[~pad].isfinite().all(), op


def test_strength_zero_and_probability_zero_leave_the_input_alone():
    x = _batch()
    pad = torch.isnan(x)
    for op in FINETUNE_AUGMENT_OPS:
        y = ecg_randaugment(x, [op], 1, 0.0, 1.0, _gen())
        # flip has no strength; every other op's effect grows from nothing
        expected = -x if op == "flip" else x
        assert torch.equal(y[~pad], expected[~pad]), op
    assert torch.equal(ecg_randaugment(x, FINETUNE_AUGMENT_OPS, 3, 1.0, 0.0, _gen()).nan_to_num(), x.nan_to_num())


def test_policy_is_deterministic_under_the_generator_and_draws_ops_per_sample():
    x = _batch()
    a = ecg_randaugment(x, FINETUNE_AUGMENT_OPS, 2, 0.5, 0.9, _gen(3))
    b = ecg_randaugment(x, FINETUNE_AUGMENT_OPS, 2, 0.5, 0.9, _gen(3))
    c = ecg_randaugment(x, FINETUNE_AUGMENT_OPS, 2, 0.5, 0.9, _gen(4))
    assert torch.equal(a.nan_to_num(), b.nan_to_num()) and not torch.equal(a.nan_to_num(), c.nan_to_num())
    # two ops, one each: some samples are flipped exactly, others noised (per sample, one call)
    y = ecg_randaugment(x[1:], ["flip", "noise"], 1, 0.5, 1.0, _gen(0))
    flipped = [bool(torch.equal(y[i], -x[1 + i])) for i in range(7)]
    assert any(flipped) and not all(flipped)
    with pytest.raises(ValueError, match="unknown augmentation op.*known: erase"):
        ecg_randaugment(x, ["warp"], 1, 0.5, 1.0, _gen())


# ---------------------------------------------------------------------------- layer decay, head, lr


def _classifier(depth: int = 3, **kw) -> Classifier:
    torch.manual_seed(0)
    return Classifier(Encoder(n_patches=30, dim=32, depth=depth, num_heads=2), 4, STANDARD_LEADS, False, **kw)


def _expected_scale(name: str, decay: float, depth: int) -> float:
    if not name.startswith("encoder.") or name.startswith("encoder.transformer.norm."):
        return 1.0                                        # head, pooling, final norm
    if name.startswith("encoder.transformer.blocks."):
        return decay ** (depth - int(name.split(".")[3]))
    return decay ** (depth + 1)                           # patch, lead and position embeddings


def test_layer_decay_groups_cover_every_parameter_once_at_the_specified_lr():
    model = _classifier(pooling="attention")
    cfg = tiny_config("finetune.layer_decay=0.5", "finetune.lr=1e-3", "encoders.coreecg.depth=3")
    step = FinetuneStep(model, cfg, Schedule(10, 1, 0))
    names = {id(p): n for n, p in model.named_parameters()}
    seen = [names[id(p)] for g in step.optimizer.param_groups for p in g["params"]]
    assert sorted(seen) == sorted(names.values())            # each parameter once
    default = {names[id(p)]: g["weight_decay"] for g in param_groups(model, 0.01) for p in g["params"]}
    step(torch.randn(2, 12, 2250), torch.eye(4)[:2])          # step 0 of a warm-up-free cosine: the base lr
    for g in step.optimizer.param_groups:
        for p in g["params"]:
            n = names[id(p)]
            assert g["lr"] == pytest.approx(1e-3 * _expected_scale(n, 0.5, 3), rel=1e-12), n
            assert g["weight_decay"] == default[n], n        # decay exemptions as without layer decay
    assert {g["lr"] for g in step.optimizer.param_groups} >= {1e-3, 1e-3 * 0.5 ** 4}
    # off (1.0): the two groups of before, no lr factor
    off = param_groups(model, 0.01)
    assert len(off) == 2 and all("lr_scale" not in g for g in off)


def test_layer_decay_reads_st_mem_block_names():
    from coreecg.model.published.st_mem import STMemEncoder
    from coreecg.train.optim import layer_lr_scales

    enc = STMemEncoder(n_patches=30, dim=32, depth=2, num_heads=2)
    scales = layer_lr_scales(Classifier(enc, 3, STANDARD_LEADS, False), 0.5)
    assert all(v == 0.25 for n, v in scales.items() if n.startswith("encoder.block0."))
    assert all(v == 0.5 for n, v in scales.items() if n.startswith("encoder.block1."))
    assert scales["encoder.pos_embedding"] == 0.125 and scales["encoder.norm.weight"] == 1.0
    assert scales["head.weight"] == 1.0


def test_linear_modes_train_at_linear_lr_and_the_others_at_lr():
    for mode, lr in (("linear", 2e-3), ("frozen", 2e-3), ("finetune", 5e-5), ("scratch", 5e-5)):
        cfg = tiny_config(f"finetune.mode={mode}", "finetune.lr=5e-5", "finetune.linear_lr=2e-3")
        model = Classifier.for_mode(_classifier().encoder, 4, STANDARD_LEADS, False, mode)
        step = FinetuneStep(model, cfg, Schedule(10, 1, 0))
        step(torch.randn(2, 12, 2250), torch.eye(4)[:2])
        assert {g["lr"] for g in step.optimizer.param_groups} == {lr}, mode
    assert load_config().finetune.linear_lr == 1e-3 and load_config().finetune.lr == 8e-5


def test_attention_head_in_finetune_mode_trains_encoder_and_pool():
    model = Classifier.for_mode(_classifier(depth=2).encoder, 4, STANDARD_LEADS, True, "finetune", "attention")
    assert model.pool is not None and not model.frozen_encoder
    out = model(torch.randn(3, 12, 2250), torch.eye(4)[:3])
    assert out["logits"].shape == (3, 4)
    out["loss"].backward()
    first_block = next(model.encoder.transformer.blocks[0].parameters())
    for p in (model.pool.query, model.pool.kv.weight, first_block, next(model.encoder.patch_embed.parameters())):
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert Classifier.for_mode(_classifier().encoder, 4, STANDARD_LEADS, False, "frozen").pool is not None
    assert Classifier.for_mode(_classifier().encoder, 4, STANDARD_LEADS, False, "scratch").pool is None


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize("overrides, match", [
    (["finetune.augment=[erase,warp]"], r"unknown: \['warp'\]"),
    (["finetune.augment=[noise,noise]"], "distinct names from"),
    (["finetune.mode=linear", "finetune.head=attention"], "mode frozen"),
    (["finetune.mode=frozen", "finetune.head=mean"], "mode linear"),
    (["finetune.mode=linear", "finetune.layer_decay=0.7"], "trains the head alone"),
    (["finetune.layer_decay=0"], r"\(0, 1\]"),
    (["finetune.layer_decay=1.5"], r"\(0, 1\]"),
    (["finetune.augment=[noise]", "finetune.augment_magnitude=2"], "augment_magnitude"),
    (["finetune.augment=[noise]", "finetune.augment_num_ops=0"], "augment_num_ops"),
    (["finetune.mode=linear", "finetune.augment=[noise]"], "probe_crops=random"),
    (["finetune.linear_lr=0"], "linear_lr"),
])
def test_config_refuses_options_where_they_mean_nothing(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=overrides)


def test_config_options_round_trip_and_old_configs_load(tmp_path):
    cfg = load_config(overrides=["finetune.augment=[erase,sine]", "finetune.layer_decay=0.65",
                                 "finetune.head=attention", "finetune.linear_lr=3e-3"])
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg.to_dict()))             # YAML is a superset of JSON
    again = load_config(path)
    assert again.finetune == cfg.finetune and again.finetune.augment == ("erase", "sine")
    old = cfg.to_dict()
    for key in ("augment", "augment_num_ops", "augment_magnitude", "augment_prob", "layer_decay", "head",
                "linear_lr"):
        del old["finetune"][key]                           # a config written before these options
    path.write_text(json.dumps(old))
    f = load_config(path).finetune
    assert (f.augment, f.layer_decay, f.head, f.pooling) == ((), 1.0, "auto", "mean")
    assert load_config(overrides=["finetune.mode=frozen"]).finetune.pooling == "attention"
    assert load_config(overrides=["finetune.mode=linear", "finetune.probe_crops=random",
                                  "finetune.augment=[noise]"]).finetune.augment == ("noise",)


# ---------------------------------------------------------------------------- a run, every option on


@pytest.fixture(scope="module")
def ptbxl(ray_session, ecg_data, tmp_path_factory):
    from tests.helpers import build_ptbxl

    return build_ptbxl(tmp_path_factory.mktemp("opt-corpus"), ecg_data)


def _cfg(tmp: Path, corpus: Path, *extra: str):
    return load_config(overrides=[
        *TINY, f"data.corpus={corpus}", "finetune.mode=scratch", "finetune.batch_size=16", "finetune.lr=1e-3",
        "finetune.epochs=1", "finetune.bootstrap_resamples=0", "finetune.tsne_max_points=0", "train.num_workers=1",
        "train.checkpoint_every_steps=0", f"train.storage_path={tmp}", "train.name=all", "finetune.head=attention",
        "finetune.layer_decay=0.75", f"finetune.augment=[{','.join(FINETUNE_AUGMENT_OPS)}]", *extra])


@pytest.mark.slow
def test_every_option_on_trains_and_augments_training_crops_only(ptbxl, tmp_path, monkeypatch):
    import coreecg.train.finetuning as ft
    from coreecg.loading import load_classifier
    from coreecg.train.fit import fit, plan_run

    cfg = _cfg(tmp_path, ptbxl)
    # training crops are augmented, evaluation never is: count the policy's calls per path
    calls = []
    real = ft.ecg_randaugment
    monkeypatch.setattr(ft, "ecg_randaugment", lambda x, *a, **k: calls.append(x.shape) or real(x, *a, **k))
    plan = plan_run(cfg, "finetune")
    task = ft.FinetuneTask(plan, torch.device("cpu"))
    signal = torch.from_numpy(task._split("val").signal[:4]).float()
    uid = torch.arange(4)
    (x1, _), _ = task.inputs(signal, uid, 0, _gen(1))
    (x2, _), _ = task.inputs(signal, uid, 0, _gen(1))
    assert len(calls) == 2 and torch.equal(x1.nan_to_num(), x2.nan_to_num())
    plain = ft.FinetuneTask(plan_run(_cfg(tmp_path, ptbxl, "finetune.augment=[]"), "finetune"), torch.device("cpu"))
    (x0, _), _ = plain.inputs(signal, uid, 0, _gen(1))
    assert len(calls) == 2 and not torch.equal(x0.nan_to_num(), x1.nan_to_num())
    core = Classifier.for_mode(Encoder(n_patches=30, dim=32, depth=2, num_heads=2), len(task.class_names),
                               STANDARD_LEADS, task.multilabel, "scratch", "attention")
    task._records(core.eval(), "val")
    assert len(calls) == 2                                   # evaluation: no augmentation

    result = fit(plan, report_fn=lambda m: None)             # the shared loop, in this process, one epoch
    metrics = json.loads((result.run_dir / "metrics.json").read_text())
    assert metrics["test"]["auroc"] is not None and metrics["mode"] == "scratch"
    model = load_classifier(result.run_dir)                  # rebuilt with its attention head
    assert model.pool is not None
