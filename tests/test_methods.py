"""The contrastive baselines (MoCo v3, CMSC) and the method registry: losses against hand
computations, the momentum encoder's EMA rule, the views, the segments, the 2-rank equality of
the gathered losses, and a plugin method through the config and the loop."""
from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config import ConfigError, config_from_dict, load_config
from coreecg.methods import CMSC, CoReECG, MoCoV3, build_method
from coreecg.methods.cmsc import cmsc_contrastive, segment_masks
from coreecg.methods.moco_v3 import moco_contrastive
from coreecg.methods.views import random_view, resized_crop, time_mask
from coreecg.checkpoints import CheckpointError
from coreecg.train.resume_check import check_compatible
from coreecg.train.step import PretrainStep, Schedule
from tests.helpers import TINY, run_on_ranks, tiny_config

REPO = Path(__file__).resolve().parents[1]
SMALL_HEADS = ["methods.moco_v3.hidden_dim=64", "methods.moco_v3.dim=16", "methods.cmsc.dim=16"]


def _cfg(method: str, *extra: str):
    return tiny_config(f"pretrain.method={method}", *SMALL_HEADS, *extra)


def _x(b: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, 12, 2250, generator=torch.Generator().manual_seed(seed))


def _cos(u, v) -> float:
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


# ---------------------------------------------------------------------------- MoCo v3


def test_moco_loss_is_the_hand_computed_infonce_times_two_tau():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    tau = 0.2
    want = 0.0
    for i in range(3):
        logits = [_cos(q[i].tolist(), k[j].tolist()) / tau for j in range(3)]
        want += -(logits[i] - math.log(sum(math.exp(v) for v in logits))) / 3
    assert moco_contrastive(q, k, tau).item() == pytest.approx(2 * tau * want, rel=1e-5)


def test_moco_forward_is_the_symmetric_loss_of_its_own_parts():
    model = MoCoV3(_cfg("moco_v3")).train()
    x = _x()
    out = model(x, torch.Generator().manual_seed(3))
    views = model.views(x, torch.Generator().manual_seed(3))        # the same draw
    q = [model.predictor(model.projector(model.encoder.pooled(v))) for v in views.split(4)]
    k = [model.momentum_projector(model.momentum_encoder.pooled(v)) for v in views.split(4)]
    want = moco_contrastive(q[0], k[1], 0.2) + moco_contrastive(q[1], k[0], 0.2)
    assert out["loss"].item() == pytest.approx(want.item(), rel=1e-5)


def test_moco_momentum_encoder_gets_no_gradient_and_moves_by_the_ema_rule():
    cfg = _cfg("moco_v3", "optim.lr=1e-2")
    model = MoCoV3(cfg)
    step = PretrainStep(model, cfg, Schedule(steps_per_epoch=10, epochs=1, warmup_epochs=0))
    assert step.ema == (0.99, 1.0)                  # MoCo v3's ViT momentum, not CoRe-ECG's teacher's
    teacher = {n: p.detach().clone() for n, p in model.momentum_encoder.named_parameters()}
    assert not any(p.requires_grad for p in model.momentum_encoder.parameters())
    # keys are computed without autograd: even parameters that asked for a gradient get none
    probe = copy.deepcopy(model)
    for p in [*probe.momentum_encoder.parameters(), *probe.momentum_projector.parameters()]:
        p.requires_grad_(True)
    probe(_x())["loss"].backward()
    assert all(p.grad is None for p in [*probe.momentum_encoder.parameters(), *probe.momentum_projector.parameters()])
    assert all(p.grad is not None for p in probe.predictor.parameters())
    out = step(_x(), generator=torch.Generator().manual_seed(0))
    m = float(out["ema_momentum"])
    assert m == pytest.approx(0.99)                 # step 0 of the cosine schedule
    student = dict(model.encoder.named_parameters())
    moved = 0
    for name, p in model.momentum_encoder.named_parameters():
        want = m * teacher[name] + (1 - m) * student[name].detach()
        assert torch.allclose(p, want, atol=1e-7), name
        moved += int(not torch.equal(p, teacher[name]))
    assert moved > 0
    # MoCo v3's ViT trick: the random patch projection stays frozen, the rest learns
    assert not model.encoder.patch_embed.conv.weight.requires_grad
    assert torch.equal(model.encoder.patch_embed.conv.weight, model.momentum_encoder.patch_embed.conv.weight)


def test_views_differ_from_each_other_and_repeat_under_a_seed():
    model = MoCoV3(_cfg("moco_v3"))
    x = _x()
    v = model.views(x, torch.Generator().manual_seed(5))
    v1, v2 = v.split(4)
    assert v.shape == (8, 12, 2250)
    assert not torch.allclose(v1, v2) and not torch.allclose(v1, x)
    assert torch.equal(v, model.views(x, torch.Generator().manual_seed(5)))
    assert not torch.equal(v, model.views(x, torch.Generator().manual_seed(6)))


def test_view_augmentations_do_what_they_say():
    x = torch.arange(10.0).repeat(2, 1, 1)                                  # (2, 1, 10) ramp
    same = resized_crop(x, torch.ones(2), torch.zeros(2))
    assert torch.allclose(same, x)                                          # scale 1: identity
    half = resized_crop(x, torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0]))
    assert half[0, 0].max() <= 4.5 and half[1, 0].min() >= 4.5               # first / last half, stretched
    assert torch.all(half[:, 0, 1:] >= half[:, 0, :-1])                     # still a ramp
    masked = time_mask(torch.ones(2, 3, 100), torch.tensor([0.2, 0.4]), torch.tensor([0.0, 1.0]))
    assert masked[0, :, :20].eq(0).all() and masked[0, :, 20:].eq(1).all()
    assert masked[1, :, 60:].eq(0).all() and masked[1, :, :60].eq(1).all()
    assert torch.equal(masked[:, 0], masked[:, 2])                          # every lead alike
    cfg = load_config(overrides=["methods.moco_v3.views.crop_min=1", "methods.moco_v3.views.time_mask_min=0",
                                 "methods.moco_v3.views.time_mask_max=0",
                                 "methods.moco_v3.views.gain_max=2"]).methods.moco_v3.views
    y = _x(2)
    gains = random_view(y, cfg, 250.0, torch.Generator().manual_seed(0)) / y
    per_lead = gains[..., 0]
    assert torch.allclose(gains, per_lead[..., None].expand_as(gains), rtol=1e-4)    # one gain per lead
    assert per_lead.min() >= 0.5 - 1e-6 and per_lead.max() <= 2.0 + 1e-6


# ---------------------------------------------------------------------------- CMSC


def test_cmsc_segments_are_adjacent_non_overlapping_and_cover_the_window():
    masks = segment_masks(3, 2, 12, 30).view(3, 2, 12, 30)
    assert masks.sum(0).eq(1).all()                                         # a partition of the grid
    for s in range(3):
        cols = masks[s, 0, 0].nonzero().flatten().tolist()
        assert cols == list(range(10 * s, 10 * s + 10))                     # contiguous, in order
        assert masks[s].eq(masks[s, :1, :1]).all()                          # every lead, every sample


def test_cmsc_segments_are_encoded_separately():
    model = CMSC(_cfg("cmsc")).eval()
    x = _x(2)
    z = model.embed_segments(x)
    y = x.clone()
    y[..., 1125:] += torch.randn(2, 12, 1125)                             # change the second half only
    z2 = model.embed_segments(y)
    assert torch.allclose(z[0], z2[0], atol=1e-6) and not torch.allclose(z[1], z2[1], atol=1e-3)


def _clocs_by_hand(a, b, patient, tau):
    """CLOCS's patient-specific CMSC loss, one scalar at a time: per direction, the mean of the
    own pairs' -log p and the same-patient pairs' -log p (every candidate in the softmax)."""
    n = len(patient)

    def log_p(u, v, i, j):
        logits = [_cos(u[i].tolist(), v[k].tolist()) / tau for k in range(n)]
        return logits[j] - math.log(sum(math.exp(x) for x in logits))

    def direction(u, v):
        own = -sum(log_p(u, v, i, i) for i in range(n)) / n
        pairs = [(i, j) for i in range(n) for j in range(n) if i != j and patient[i] == patient[j]]
        if not pairs:
            return own
        return (own - sum(log_p(u, v, i, j) for i, j in pairs) / len(pairs)) / 2

    return (direction(a, b) + direction(b, a)) / 2


def test_cmsc_loss_takes_same_patient_windows_as_positives_as_clocs_does():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    patient = [7, 7, 3, 9]                       # windows 0 and 1: one patient (other recordings)
    tau = 0.1
    a_, b_ = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    loss = cmsc_contrastive(a_, b_, tau, torch.tensor(patient))
    assert loss.item() == pytest.approx(_clocs_by_hand(a, b, patient, tau), rel=1e-5)
    loss.backward()                              # both views of every window get a gradient
    assert a_.grad.abs().sum(1).gt(0).all() and b_.grad.abs().sum(1).gt(0).all()
    # no shared patient: CLOCS's own-pair terms alone, today's symmetric InfoNCE
    alone = cmsc_contrastive(a, b, tau, torch.arange(4))
    assert alone.item() == pytest.approx(_clocs_by_hand(a, b, [0, 1, 2, 3], tau), rel=1e-5)
    assert alone.item() != pytest.approx(loss.item(), rel=1e-3)
    assert cmsc_contrastive(a, b, tau, None).item() == pytest.approx(alone.item())
    # two near-identical windows: a hard negative pair when the patients differ, a positive pair
    # (low loss) when they share one
    twin = torch.randn(5, generator=g)
    a[0] = b[0] = twin
    a[1] = b[1] = twin + 0.01 * torch.randn(5, generator=g)
    shared = cmsc_contrastive(a, b, tau, torch.tensor(patient))
    assert shared < cmsc_contrastive(a, b, tau, torch.arange(4)) - 0.2


def test_cmsc_model_takes_patient_ids_from_the_loop():
    model = CMSC(_cfg("cmsc"))
    assert model.needs_patient_ids and not CoReECG(tiny_config()).needs_patient_ids
    x = _x()
    one = model(x, patient=torch.tensor([0, 0, 1, 1]))["loss"]
    own = model(x, patient=None)["loss"]
    assert one.item() != pytest.approx(own.item())


# ---------------------------------------------------------------------------- two ranks


def _rank(rank, world, q_all, k_all, patient_all):
    b = q_all.shape[0] // world
    q = q_all[rank * b:(rank + 1) * b].clone().requires_grad_(True)
    k = k_all[rank * b:(rank + 1) * b].clone().requires_grad_(True)
    patient = patient_all[rank * b:(rank + 1) * b].clone()
    moco = moco_contrastive(q, k, 0.2)
    (moco / world).backward()                     # DDP averages gradients over ranks
    qa = q_all[rank * b:(rank + 1) * b].clone().requires_grad_(True)
    kb = k_all[rank * b:(rank + 1) * b].clone().requires_grad_(True)
    cmsc = cmsc_contrastive(qa, kb, 0.1, patient)
    (cmsc / world).backward()
    return moco.detach(), q.grad.clone(), cmsc.detach(), qa.grad.clone(), kb.grad.clone()


def test_gathered_losses_on_two_ranks_equal_one_rank_on_the_global_batch():
    g = torch.Generator().manual_seed(0)
    q_all, k_all = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
    patient = torch.tensor([0, 1, 2, 3, 0, 5, 6, 3])     # patients shared across the two ranks
    results = run_on_ranks(_rank, q_all, k_all, patient)

    q, k = q_all.clone().requires_grad_(True), k_all.clone().requires_grad_(True)
    moco = moco_contrastive(q, k, 0.2)
    moco.backward()
    assert torch.allclose((results[0][0] + results[1][0]) / 2, moco, atol=1e-6)
    assert torch.allclose(torch.cat([results[0][1], results[1][1]]), q.grad, atol=1e-6)
    a, b = q_all.clone().requires_grad_(True), k_all.clone().requires_grad_(True)
    cmsc = cmsc_contrastive(a, b, 0.1, patient)
    cmsc.backward()
    assert torch.allclose((results[0][2] + results[1][2]) / 2, cmsc, atol=1e-6)
    assert torch.allclose(torch.cat([results[0][3], results[1][3]]), a.grad, atol=1e-6)
    assert torch.allclose(torch.cat([results[0][4], results[1][4]]), b.grad, atol=1e-6)
    # negatives really crossed ranks: two local losses differ from the global one
    local = (moco_contrastive(q_all[:4], k_all[:4], 0.2) + moco_contrastive(q_all[4:], k_all[4:], 0.2)) / 2
    assert not torch.allclose(local, moco)


# ---------------------------------------------------------------------------- registry and config


@pytest.mark.parametrize("method", ["core", "moco_v3", "cmsc"])
def test_every_method_trains_the_one_encoder_and_has_gradient(method):
    cfg = _cfg(method)
    model = build_method(cfg)
    out = model(_x(), torch.Generator().manual_seed(0), patient=torch.arange(4))
    out["loss"].backward()
    assert all(v.ndim == 0 for v in out.values()) and out["loss"].requires_grad
    grads = [p.grad for n, p in model.encoder.named_parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    # only the branches a method uses are built: no unused parameters under DDP
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, unused


def test_method_options_are_typed_validated_and_saved():
    cfg = load_config(overrides=["pretrain.method=moco_v3", "methods.moco_v3.temperature=0.1"])
    assert cfg.method_label == "MoCo V3" and cfg.method_options.temperature == 0.1
    assert config_from_dict(cfg.to_dict()) == cfg
    assert load_config(overrides=["pretrain.method=cmsc"]).method_label == "CMSC"
    assert load_config(overrides=["pretrain.method=cmsc", "train.variant=Mine"]).method_label == "Mine"
    for bad, words in [("pretrain.method=simclr", "not a registered method"),
                       ("methods.simclr.tau=1", "no registered method"),
                       ("methods.moco_v3.tau=1", "methods.moco_v3.tau"),
                       ("methods.moco_v3.momentum=2", "momentum"),
                       ("methods.moco_v3.views.crop_min=0", "crop_min"),
                       ("methods.cmsc.segments=7", None)]:
        with pytest.raises(ConfigError, match=words):
            load_config(overrides=["pretrain.method=cmsc" if "segments" in bad else "encoders.coreecg.depth=10", bad])


def test_a_checkpoint_of_another_method_is_refused():
    moco, cmsc = _cfg("moco_v3"), _cfg("cmsc")
    with pytest.raises(CheckpointError, match="pretrain.method"):
        check_compatible("x.pt", moco, cmsc)
    with pytest.raises(CheckpointError, match="methods.moco_v3.dim"):
        check_compatible("x.pt", moco, _cfg("moco_v3", "methods.moco_v3.dim=32"))
    check_compatible("x.pt", moco, _cfg("moco_v3", "methods.moco_v3.temperature=0.5"))   # not structural


def test_the_documented_plugin_is_the_tested_one_and_trains(tmp_path):
    doc = (REPO / "docs" / "methods.md").read_text()
    block = re.search(r"```python\n# tests/plugin_method.py\n(.*?)```", doc, re.S).group(1)
    assert block == (REPO / "tests" / "plugin_method.py").read_text()
    from coreecg.train.pretraining import pretrain_local

    cfg = tiny_config("plugins=[tests.plugin_method]", "pretrain.method=patch_regression",
                      "methods.patch_regression.ratio=0.3", "optim.batch_size=8", "optim.epochs=3",
                      "optim.lr=1e-3", "optim.warmup_epochs=0", "train.eval_every_epochs=0")
    assert cfg.method_label == "Patch regression"
    windows = np.random.default_rng(0).standard_normal((32, 12, 2500)).astype(np.float32)
    pretrain_local(cfg, windows, tmp_path)
    losses = [float(x.split('"loss": ')[1].split(",")[0]) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if '"kind": "epoch"' in x]
    assert len(losses) == 3 and losses[-1] < losses[0]
    import coreecg

    enc = coreecg.load_encoder(tmp_path / "encoder.pt")          # the one encoder, as for every method
    assert enc.pooled(_x(2)).shape == (2, 32)
    # Re-read in a fresh process: the plugin is re-imported from plugins; and a plain
    # config written here, after the plugin was imported, holds no section of it.
    core_yaml = tmp_path / "core.yaml"
    tiny_config().to_yaml(core_yaml)
    assert "patch_regression" not in core_yaml.read_text()
    code = ("from coreecg.config import load_config as l; import sys; "
            "c = l(sys.argv[1]); assert c.methods.patch_regression.ratio == 0.3, c; l(sys.argv[2]); print('ok')")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "config.yaml"), str(core_yaml)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.slow
def test_a_plugin_method_runs_through_the_pretrain_job_on_ray_workers(ray_session, tmp_path):
    """What docs/methods.md promises: a module named in plugins (resolved from the folder
    the job runs in) trains on Ray Train workers through jobs/pretrain.py."""
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    sets = ["plugins=[tests.plugin_method]", "pretrain.method=patch_regression",
            "methods.patch_regression.ratio=0.3", "optim.epochs=2", "data.synthetic_records=128",
            "optim.batch_size=16", f"train.storage_path={tmp_path}", "train.name=plug",
            f"data.cache_dir={tmp_path / 'corpora'}", "data.probe_max_windows=64",
            *TINY]
    done = subprocess.run([sys.executable, "jobs/pretrain.py", *sum((["--set", s] for s in sets), [])], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "method: Patch regression (pretrain.method=patch_regression)" in done.stdout
    epochs = [x for x in (tmp_path / "plug" / "metrics.jsonl").read_text().splitlines() if '"kind": "epoch"' in x]
    assert len(epochs) == 2 and all('"loss_patch"' in e for e in epochs)
    import coreecg

    assert coreecg.load_encoder(tmp_path / "plug" / "encoder.pt").pooled(_x(2)).shape == (2, 32)
