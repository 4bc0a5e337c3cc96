"""Encoders as plugins (issue 55): the registry and the one build path, the output kinds and the
refusal of a (method, encoder) pair that cannot work, the two families the field ranks highest
(xresnet1d, a diagonal state-space encoder) against direct computations, the methods and the
classifier on every encoder, and an encoder written outside the package taken through pretraining,
fine-tuning, export and a fresh-process load."""
from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config import ConfigError, load_config
from tests.helpers import TINY

REPO = Path(__file__).resolve().parents[1]
XRES = ["model.arch=xresnet1d", "encoders.xresnet1d.stem=[8,8,16]", "encoders.xresnet1d.widths=[16,32]",
        "encoders.xresnet1d.layers=[1,1]", "encoders.xresnet1d.expansion=1"]
S4 = ["model.arch=s4", "encoders.s4.d_model=16", "encoders.s4.n_layers=2", "encoders.s4.d_state=8",
      "encoders.s4.stem=[16,16]", "encoders.s4.stem_strides=[5,3]", "encoders.s4.dropout=0.0"]
MOCO = ["pretrain.method=moco_v3", "methods.moco_v3.hidden_dim=32", "methods.moco_v3.dim=16"]
ENCODERS = {"xresnet1d": XRES, "s4": S4}


def test_every_encoder_is_built_through_the_registry():
    from coreecg.encoders import build_encoder, encoder_specs
    from coreecg.model.encoder import Encoder
    from coreecg.model.s4 import S4Encoder
    from coreecg.model.xresnet1d import XResNet1d

    assert {"coreecg", "st_mem", "xresnet1d", "s4"} <= set(encoder_specs())
    built = {a: build_encoder(load_config(overrides=[*TINY, *ENCODERS.get(a, [f"model.arch={a}"])]))
             for a in ("coreecg", "xresnet1d", "s4")}
    assert (type(built["coreecg"]), type(built["xresnet1d"]), type(built["s4"])) == (Encoder, XResNet1d, S4Encoder)
    assert [encoder_specs()[a].output for a in built] == ["grid", "sequence", "sequence"]
    with pytest.raises(ConfigError, match=r"model.arch='resnet9' is not a registered encoder; known: coreecg, "
                                          r"st_mem, xresnet1d, s4.*plugins"):
        load_config(overrides=["model.arch=resnet9"])
    with pytest.raises(ConfigError, match=r"layers give one count per width"):
        load_config(overrides=["model.arch=xresnet1d", "encoders.xresnet1d.layers=[1,1]"])
    # a saved config holds the encoders' sections; an old one (without) loads with their defaults
    plain = load_config(overrides=XRES).to_dict()
    assert plain["encoders"]["xresnet1d"]["widths"] == [16, 32] and "s4" in plain["encoders"]


def test_a_pair_that_cannot_work_is_refused_naming_the_pairs_that_do(tmp_path):
    from coreecg.methods import build_method
    from coreecg.train.plan import PlanError
    from coreecg.train.pretraining import plan_pretrain

    cfg = load_config(overrides=[*TINY, *S4, "pretrain.method=core"])
    # plugins another test imported into this process (a plugin encoder, a plugin method) may follow each list
    pattern = (r"pretrain.method=core needs an encoder whose output is a grid .* model.arch=s4 .* yields a sequence\. "
               r"Pairs that work: core on coreecg(, \w+)*; moco_v3 on coreecg, xresnet1d, s4(, \w+)*; "
               r"cmsc on coreecg, xresnet1d, s4(, \w+)*;")
    with pytest.raises(ConfigError, match=pattern):
        build_method(cfg)
    with pytest.raises(PlanError, match=pattern):
        plan_pretrain(load_config(overrides=[*TINY, *S4, "pretrain.method=core", f"train.storage_path={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"st_mem.*published weights.*not pretrained here"):
        build_method(load_config(overrides=["model.arch=st_mem", "pretrain.method=moco_v3"]))


def test_the_s4d_kernel_is_its_recurrence():
    """The FFT convolution with the unrolled kernel equals stepping the discretised state x_k =
    exp(dt A) x_{k-1} + (exp(dt A) - 1) / A u_k, y_k = 2 Re(C x_k), channel by channel."""
    from coreecg.model.s4 import S4DKernel, fft_conv

    torch.manual_seed(0)
    kernel = S4DKernel(3, d_state=8, dt_min=0.01, dt_max=0.2)
    L = 40
    u = torch.randn(2, 3, L)
    with torch.no_grad():
        fast = fft_conv(u, kernel(L))
        A, dt, C = (t.double() if not t.is_complex() else t.to(torch.cdouble) for t in kernel.modes())
    a_bar, b_bar = torch.exp(A * dt[:, None]), (torch.exp(A * dt[:, None]) - 1) / A          # (H, n)
    state = torch.zeros(2, 3, A.shape[1], dtype=torch.cdouble)
    slow = torch.empty(2, 3, L, dtype=torch.double)
    for k in range(L):
        state = a_bar * state + b_bar * u[..., k, None].double()
        slow[..., k] = 2 * (C * state).sum(-1).real
    np.testing.assert_allclose(fast.double().numpy(), slow.numpy(), rtol=1e-4, atol=1e-5)


def test_the_s4_kernel_spectrum_is_kept_without_autograd_and_follows_the_weights():
    """Inference reuses rfft(K, 2L) (the kernel depends on weights and L only); an in-place change
    of a weight (an optimiser step), load_state_dict and a dtype move each give the new kernel's;
    under autograd it is computed (and carries gradients); the encoder's outputs are unchanged."""
    from coreecg.encoders import build_encoder
    from coreecg.model.s4 import S4DKernel

    torch.manual_seed(0)
    kernel = S4DKernel(4, d_state=8)

    def fresh(L):
        with torch.no_grad():
            return torch.fft.rfft(kernel(L), 2 * L)

    with torch.no_grad():
        first = kernel.spectrum(30)
        assert kernel.spectrum(30) is first and kernel.spectrum(31) is not first
        torch.testing.assert_close(first, fresh(30))
        kernel.log_dt.add_(0.5)                              # what an optimiser step does: in place
        moved = kernel.spectrum(30)
    assert moved is not first and not torch.allclose(moved, first)
    torch.testing.assert_close(moved, fresh(30))
    other = S4DKernel(4, d_state=8)
    kernel.load_state_dict(other.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(kernel.spectrum(30), torch.fft.rfft(other(30), 60))
    kernel.double()
    assert kernel._spectra == {}                             # a dtype or device move clears the cache
    spectrum = kernel.float().spectrum(30)                   # autograd on: computed, differentiable
    assert spectrum.requires_grad and kernel._spectra == {}
    spectrum.abs().sum().backward()
    assert kernel.log_dt.grad is not None and kernel.log_dt.grad.abs().sum() > 0

    enc = build_encoder(load_config(overrides=S4)).eval()
    x = torch.randn(2, 12, 1500)
    with_grad = enc.pooled(x).detach()
    with torch.inference_mode():
        cached, again = enc.pooled(x), enc.pooled(x)
    torch.testing.assert_close(cached, with_grad, rtol=1e-5, atol=1e-6)
    assert torch.equal(cached, again)


def test_s4_on_the_cpu_without_autograd_runs_in_chunks_with_the_whole_batchs_values():
    from coreecg.encoders import build_encoder
    from coreecg.model.layer_features import pooled_layers
    from coreecg.model.s4 import CPU_ROWS, unchunked

    enc = build_encoder(load_config(overrides=S4)).eval()
    assert enc.cpu_rows == CPU_ROWS > 0
    x = torch.randn(2 * CPU_ROWS + 1, 12, 1500)                    # two whole chunks and a short one
    calls = []
    hook = enc.blocks[0].register_forward_hook(lambda _m, inp, _o: calls.append(len(inp[0])))
    try:
        with torch.inference_mode():
            chunked = enc.pooled(x)
            with unchunked(enc):
                whole = enc.pooled(x)
        assert calls == [CPU_ROWS, CPU_ROWS, 1, len(x)] and enc.cpu_rows == CPU_ROWS
        torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
        calls.clear()
        enc.pooled(x.requires_grad_()).sum().backward()           # under autograd: one pass
        assert calls == [len(x)] and x.grad is not None
        calls.clear()
        with torch.no_grad():
            layers = pooled_layers(enc, x)                          # its hooks see one call per block
        assert calls == [len(x)] and len(layers) == len(enc.blocks)
        torch.testing.assert_close(layers[-1], whole, rtol=1e-5, atol=1e-6)
    finally:
        hook.remove()


def test_a_causal_s4_encoder_does_not_see_the_future():
    from coreecg.encoders import build_encoder

    enc = build_encoder(load_config(overrides=S4)).eval()
    x = torch.randn(1, 12, 1500)
    y = x.clone()
    y[..., 900:] = torch.randn(1, 12, 600)                         # only the future changes
    a, b = enc(x).tokens, enc(y).tokens
    step = 900 // enc.patch_size
    assert torch.allclose(a[:, :step], b[:, :step], atol=1e-5) and not torch.allclose(a[:, step:], b[:, step:])


def test_xresnet1d_shapes_and_receptive_field():
    from coreecg.encoders import build_encoder

    enc = build_encoder(load_config(overrides=XRES)).eval()
    assert enc.patch_size == 8 and enc.dim == 32                     # stem 2, pool 2, one stride-2 stage
    out = enc(torch.randn(3, 12, 2250))
    assert out.tokens.shape == (3, math.ceil(2250 / 8), 32) and out.grid == (1, out.tokens.shape[1])
    # the analytic receptive field bounds what one output step sees: the gradient of the middle
    # step is zero outside it, and spreads over most of it
    for m in enc.modules():                                         # a block's branch starts at 0 (XResNet)
        if isinstance(m, torch.nn.BatchNorm1d):
            torch.nn.init.ones_(m.weight)
    x = torch.randn(1, 12, 2000, requires_grad=True)
    mid = enc(x).tokens.shape[1] // 2
    enc(x).tokens[0, mid].sum().backward()
    seen = torch.nonzero(x.grad.abs().sum(1)[0]).flatten()
    extent = int(seen.max() - seen.min() + 1)
    assert extent <= enc.receptive_field and extent > enc.receptive_field // 2, (extent, enc.receptive_field)
    # the default is xresnet1d101: 3, 4, 23, 3 bottleneck blocks
    full = load_config(overrides=["model.arch=xresnet1d"]).encoders.xresnet1d
    assert tuple(full.layers) == (3, 4, 23, 3) and full.expansion == 4 and full.kernel_size == 5


@pytest.mark.parametrize("arch", sorted(ENCODERS))
@pytest.mark.parametrize("method", ["moco_v3", "cmsc"])
def test_contrastive_methods_train_every_sequence_encoder(arch, method):
    from coreecg.methods import build_method

    cfg = load_config(overrides=[*TINY, *ENCODERS[arch], *MOCO[1:], f"pretrain.method={method}"])
    torch.manual_seed(0)
    model = build_method(cfg)
    x = torch.randn(4, 12, cfg.model.input_samples)
    x[0, :, 1800:] = float("nan")                                     # a short record's padding
    out = model(x, torch.Generator().manual_seed(0), patient=torch.arange(4))
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    grads = [p.grad for p in model.encoder.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("arch", sorted(ENCODERS))
def test_the_classifier_reads_a_lead_subset_at_its_leads_channels(arch):
    """finetune.leads [II, V1]: the rows go to the encoder's channels of II and V1, the rest 0, so a
    model fine-tuned on a subset reads the weights pretrained for those leads; padding is not pooled."""
    from coreecg.encoders import build_encoder
    from coreecg.model.classifier import Classifier

    enc = build_encoder(load_config(overrides=ENCODERS[arch])).eval()
    clf = Classifier(enc, 3, ["II", "V1"], multilabel=False).eval()
    x = torch.randn(2, 2, 2250)
    full = torch.zeros(2, 12, 2250)
    full[:, 1], full[:, 6] = x[:, 0], x[:, 1]
    torch.testing.assert_close(clf.features(x), enc.pooled(full))
    padded = x.clone()
    padded[:, :, 1500:] = float("nan")
    enc_out = enc(padded)
    assert enc_out.valid is not None and 0 < int(enc_out.valid[0].sum()) < enc_out.valid.shape[1]
    assert torch.isfinite(clf.features(padded)).all()


def test_layer_wise_decay_reads_a_sequence_encoders_blocks():
    from coreecg.encoders import build_encoder
    from coreecg.model.classifier import Classifier
    from coreecg.train.optim import layer_lr_scales, param_groups

    cfg = load_config(overrides=[*XRES, "encoders.xresnet1d.layers=[2,2]"])
    clf = Classifier(build_encoder(cfg), 3, ["I", "II"], multilabel=False)
    scales = layer_lr_scales(clf, 0.5)
    assert scales["encoder.stem.0.0.weight"] == 0.5 ** 5                     # 4 blocks: the stem below them
    assert [scales[f"encoder.blocks.{i}.branch.0.0.weight"] for i in range(4)] == [0.5 ** 4, 0.5 ** 3, 0.5 ** 2, 0.5]
    assert scales["head.weight"] == 1.0
    s4 = Classifier(build_encoder(load_config(overrides=S4)), 3, ["I"], multilabel=False)
    exempt = {id(p) for g in param_groups(s4, 0.05) if g["weight_decay"] == 0 for p in g["params"]}
    assert id(s4.encoder.blocks[0].kernel.C) in exempt and id(s4.encoder.blocks[0].out.weight) not in exempt


FRESH = """
import json, sys, torch, coreecg
enc = coreecg.load_encoder(sys.argv[1])
x = torch.load(sys.argv[2])
print(json.dumps({"class": type(enc).__name__, "pooled": enc.pooled(x).tolist()}))
"""


def test_a_plugin_encoder_pretrains_fine_tunes_exports_and_loads_in_a_fresh_process(tmp_path):
    from coreecg.data import synthetic_windows
    from coreecg.hub.export import export_model
    from coreecg.loading import load_encoder
    from coreecg.train.finetuning import FinetuneTask, plan_finetune
    from coreecg.train.loop import run_local
    from coreecg.train.pretraining import pretrain_local
    from tests.helpers import build_synthetic

    plugin = ["plugins=[tests.plugin_encoder]", "model.arch=tiny_resnet", "encoders.tiny_resnet.width=8"]
    common = ["optim.epochs=1", "optim.warmup_epochs=0", "train.eval_every_epochs=0", "train.figures=false",
              "train.device=cpu", "train.checkpoint_every_steps=0"]
    windows, _ = synthetic_windows(16, seed=0)
    pre = load_config(overrides=[*plugin, *MOCO, *common, "optim.batch_size=8"])
    summary = pretrain_local(pre, windows, tmp_path / "pre")
    assert np.isfinite(summary["loss"])
    corpus = build_synthetic(tmp_path / "corpus", 64, 3)
    ft = load_config(overrides=[*plugin, f"data.corpus={corpus}", f"finetune.encoder={tmp_path / 'pre'}",
                                "finetune.epochs=1", "finetune.batch_size=8", "finetune.bootstrap_resamples=0",
                                "finetune.tsne_max_points=0", "train.num_workers=1", "train.device=cpu",
                                "train.checkpoint_every_steps=0", f"train.storage_path={tmp_path}", "train.name=ft"])
    plan = plan_finetune(ft)
    from coreecg.data.reading import read_split

    run_local(plan, FinetuneTask(plan, torch.device("cpu")),
              read_split(corpus, "train", ["signal"], as_stored=True)["signal"])
    metrics = json.loads((plan.run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["test"]["auroc"] <= 1.0
    export_model(plan.run_dir, tmp_path / "export")
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(1))
    torch.save(x, tmp_path / "x.pt")
    here = load_encoder(tmp_path / "pre").pooled(x)
    for source in (tmp_path / "pre", plan.run_dir, tmp_path / "export"):
        done = subprocess.run([sys.executable, "-c", FRESH, str(source), str(tmp_path / "x.pt")], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["class"] == "TinyResNet", got
        if source == tmp_path / "pre":
            np.testing.assert_allclose(got["pooled"], here.tolist(), rtol=1e-5, atol=1e-6)


def test_cpc_infonce_is_its_hand_computation():
    """Two windows, four steps, two heads: every (k, t, b) term by hand, as cross-entropy of the
    dot products against the windows' encodings at step t + k; a padded step drops its terms."""
    from coreecg.methods.cpc.method import cpc_infonce

    torch.manual_seed(0)
    c, z = torch.randn(2, 4, 3), torch.randn(2, 4, 5)
    heads = torch.nn.ModuleList(torch.nn.Linear(3, 5, bias=False) for _ in range(2))
    valid = torch.tensor([[True, True, True, True], [True, True, True, False]])
    with torch.no_grad():
        loss, acc = cpc_infonce(c, z, heads, valid, temperature=0.5)
        terms, hits = [], []
        for k, head in enumerate(heads, start=1):
            for t in range(4 - k):
                for b in range(2):
                    if not (valid[b, t] and valid[b, t + k]):
                        continue
                    scores = np.array([float(head(c[b, t]) @ z[o, t + k]) / 0.5 for o in range(2)])
                    terms.append(np.log(np.exp(scores).sum()) - scores[b])
                    hits.append(scores.argmax() == b)
    assert len(terms) == 8                          # 5 + 4 (k = 1, 2) less the terms padding drops
    np.testing.assert_allclose(float(loss), np.mean(terms), rtol=1e-5)
    np.testing.assert_allclose(float(acc), np.mean(hits), rtol=1e-6)


@pytest.mark.parametrize("arch, mode", [("s4", "frames"), ("xresnet1d", "segments"), ("coreecg", "segments")])
def test_cpc_trains_every_encoder(arch, mode):
    """Frames on the causal S4 (ECG-CPC's form), segments on the others (the ViT too); gradients
    reach the encoder; a bidirectional S4 cannot give frames (its output sees the future)."""
    from coreecg.methods import build_method

    extra = ["methods.cpc.steps=3", "methods.cpc.context_dim=16", "methods.cpc.segment_samples=450"]
    cfg = load_config(overrides=[*TINY, *ENCODERS.get(arch, []), "pretrain.method=cpc", *extra])
    torch.manual_seed(0)
    model = build_method(cfg)
    assert model.mode == mode
    x = torch.randn(4, 12, cfg.model.input_samples)
    out = model(x)
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and 0 <= float(out["cpc_accuracy"]) <= 1
    grads = [p.grad for p in model.encoder.parameters() if p.requires_grad]
    assert sum(float(g.abs().sum()) for g in grads if g is not None) > 0
    with pytest.raises(ConfigError, match="context=frames needs a causal encoder"):
        build_method(load_config(overrides=[*TINY, *S4, "encoders.s4.bidirectional=true", "pretrain.method=cpc",
                                            "methods.cpc.context=frames"]))


def test_one_plugins_key_and_older_configs_read_into_it(tmp_path):
    """`plugins` is the one key for sources, methods, encoders and tables: an older config's
    `pretrain.plugins` (a file, a saved config, an override) is read into it, the lists merged."""
    import yaml

    from coreecg.config import config_from_dict

    old = load_config().to_dict()
    old["plugins"], old["pretrain"]["plugins"] = ["tests.plugin_encoder"], ["tests.plugin_method"]
    cfg = config_from_dict(old)
    assert cfg.plugins == ("tests.plugin_encoder", "tests.plugin_method") and not hasattr(cfg.pretrain, "plugins")
    (tmp_path / "old.yaml").write_text(yaml.safe_dump({"pretrain": {"plugins": ["tests.plugin_method"],
                                                                    "method": "patch_regression"}}))
    assert load_config(tmp_path / "old.yaml").plugins == ("tests.plugin_method",)
    over = load_config(overrides=["pretrain.plugins=[tests.plugin_encoder]", "model.arch=tiny_resnet"])
    assert over.plugins == ("tests.plugin_encoder",) and "plugins" not in over.to_dict()["pretrain"]


@pytest.mark.parametrize("arch", sorted(ENCODERS))
def test_every_downstream_path_takes_a_sequence_encoder(arch, tmp_path, ecg_data):
    """A pretrained xresnet1d / S4 encoder: a linear probe on cached features (the fine-tune takes
    the encoder's own sizes from its checkpoint), an export with its ONNX checked against PyTorch,
    Encoder.from_pretrained on the export, and coreecg.embed on a raw PTB-XL record."""
    import wfdb

    import coreecg
    from coreecg.checkpoints import save_encoder
    from coreecg.data.reading import read_split
    from coreecg.hub.export import export_model
    from coreecg.methods import build_method
    from coreecg.model.encoder import Encoder
    from coreecg.train.finetuning import FinetuneTask, plan_finetune
    from coreecg.train.loop import run_local
    from tests.helpers import build_synthetic

    cfg = load_config(overrides=[*TINY, *ENCODERS[arch], *MOCO])
    torch.manual_seed(0)
    save_encoder(tmp_path / "pre" / "encoder.pt", build_method(cfg), cfg, step=1)
    corpus = build_synthetic(tmp_path / "corpus", 64, 3)
    ft = load_config(overrides=[f"data.corpus={corpus}", f"finetune.encoder={tmp_path / 'pre' / 'encoder.pt'}",
                                "finetune.mode=linear", "finetune.epochs=2", "finetune.batch_size=8",
                                "finetune.bootstrap_resamples=0", "finetune.tsne_max_points=0", "train.num_workers=1",
                                "train.device=cpu", "train.checkpoint_every_steps=0", f"train.storage_path={tmp_path}",
                                "train.name=probe"])
    plan = plan_finetune(ft)
    assert plan.config.model.arch == arch and plan.config.encoders.names(arch) and \
        getattr(plan.config.encoders, arch) == getattr(cfg.encoders, arch)        # the checkpoint's sizes
    run_local(plan, FinetuneTask(plan, torch.device("cpu")),
              read_split(corpus, "train", ["signal"], as_stored=True)["signal"])
    metrics = json.loads((plan.run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["test"]["auroc"] <= 1.0
    out = export_model(plan.run_dir, tmp_path / "export", onnx=True)
    meta = json.loads((out / "config.json").read_text())
    diff = meta["onnx"]["max_abs_diff_vs_pytorch"]
    assert diff is not None and diff < 1e-3, meta["onnx"]
    encoder = Encoder.from_pretrained(out)
    assert type(encoder).__name__ == {"xresnet1d": "XResNet1d", "s4": "S4Encoder"}[arch]
    # the card and config.json describe this encoder (its own sizes), not the ViT's
    card = (out / "README.md").read_text()
    assert f"`model.arch: {arch}`" in card and "transformer encoder" not in card
    options = dataclasses.asdict(getattr(plan.config.encoders, arch))
    assert meta["architecture"]["encoder"]["options"] == json.loads(json.dumps(options))
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(encoder.pooled(x), coreecg.load_encoder(tmp_path / "pre").pooled(x))
    hea = sorted((ecg_data / "ptbxl").rglob("records500/*/*.hea"))[0]
    rec = wfdb.rdrecord(str(hea.with_suffix("")))
    emb = coreecg.embed(rec.p_signal.T, rec.fs, rec.sig_name, model=tmp_path / "pre")
    assert emb.shape == (encoder.dim,) and np.isfinite(emb).all()


def test_the_s4_convolution_by_fft_equals_the_direct_sum():
    """What an ONNX export runs (a grouped Conv1d over the kernel) is what training runs (FFT)."""
    from coreecg.model.s4 import S4DKernel, direct_conv, fft_conv

    torch.manual_seed(0)
    u, k = torch.randn(3, 4, 57), S4DKernel(4, d_state=8)(57).detach()
    torch.testing.assert_close(fft_conv(u, k), direct_conv(u, k), rtol=1e-4, atol=1e-4)


def test_encoder_cost_is_the_vits_hand_count():
    """Parameters are the module's; train FLOPs per sample of the tiny ViT by hand: every matmul
    2 x m x n x k forward, twice that backward (inputs and weights), but no input gradient for the
    patch embedding (the ECG needs none); attention's two L x L products per layer likewise."""
    from coreecg.encoders import build_encoder
    from coreecg.encoders.cost import encoder_cost

    cfg = load_config(overrides=TINY)
    m = cfg.encoders.coreecg
    L, D, P = cfg.model.n_leads * cfg.n_patches, m.embed_dim, m.patch_size
    embed = 2 * L * P * D
    linear = m.depth * 2 * L * (3 * D * D + D * D + 2 * int(m.mlp_ratio * D) * D)
    attention = m.depth * 2 * (2 * L * L * D)
    expected = 3 * (embed + linear + attention) - embed
    cost = encoder_cost(cfg)
    assert cost["parameters"] == sum(p.numel() for p in build_encoder(cfg).parameters())
    np.testing.assert_allclose(cost["train_gflop_per_sample"] * 1e9, expected, rtol=1e-6)


def _pairs():
    """Every registered method on every built-in encoder it trains with (published families excluded:
    their sizes come from their weights)."""
    from coreecg.config.method_registry import METHODS
    from coreecg.encoders import encoder_specs

    built_in = {m: s for m, s in METHODS.items() if getattr(s.options, "__module__", "").startswith("coreecg.")}
    return [(m, a) for m, spec in sorted(built_in.items())
            for a, e in encoder_specs().items() if e.built_in and not e.published and e.yields(spec.needs)]


HEADS = ["methods.moco_v3.hidden_dim=32", "methods.moco_v3.dim=16", "methods.cmsc.dim=16", "methods.cpc.context_dim=16"]


@pytest.mark.parametrize("method, arch", _pairs())
def test_no_method_builds_a_parameter_that_gets_no_gradient(method, arch):
    """What DDP with find_unused_parameters off (Ray's prepare_model) refuses on 2 workers: after one
    training step of each method x encoder pair at its defaults (issue 61: CPC's heads 10-12 had no
    (context, target) pair on 10 segments), every trainable parameter has a gradient."""
    from coreecg.methods import build_method

    cfg = load_config(overrides=[*TINY, *ENCODERS.get(arch, []), f"pretrain.method={method}", *HEADS])
    torch.manual_seed(0)
    model = build_method(cfg)
    model.train()
    out = model(torch.randn(4, 12, cfg.model.input_samples))
    out["loss"].backward()
    dead = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert dead == [], f"{method} on {arch}: no gradient for {dead}"


def test_cpc_steps_are_checked_against_the_segments_when_the_config_is_read():
    """The default derives the steps from the context (12 on the causal S4's frames, segments - 1 on
    10 segments); an explicit count past the last segment is refused before anything is built."""
    from coreecg.methods import build_method

    vit = load_config(overrides=[*TINY, "pretrain.method=cpc", *HEADS])
    assert vit.methods.cpc.steps is None and len(build_method(vit).heads) == 9
    assert len(build_method(load_config(overrides=[*TINY, *S4, "pretrain.method=cpc", *HEADS])).heads) == 12
    with pytest.raises(ConfigError, match=r"methods.cpc.steps=12 predicts up to 12 segments ahead, but "
                                          r"methods.cpc.segment_samples=225 gives 10 segments .* only steps 1..9 "
                                          r"have a \(context, target\) pair.*set methods.cpc.steps <= 9"):
        load_config(overrides=[*TINY, *XRES, "pretrain.method=cpc", "methods.cpc.steps=12"])
    assert load_config(overrides=[*TINY, *XRES, "pretrain.method=cpc", "methods.cpc.steps=9"]).methods.cpc.steps == 9
    # the causal S4 offers frames (450 of them): 12 steps are fine; bidirectional, it falls back to segments
    load_config(overrides=[*TINY, *S4, "pretrain.method=cpc", "methods.cpc.steps=12"])
    with pytest.raises(ConfigError, match="methods.cpc.steps=12 predicts"):
        load_config(overrides=[*TINY, *S4, "encoders.s4.bidirectional=true", "pretrain.method=cpc",
                               "methods.cpc.steps=12"])
