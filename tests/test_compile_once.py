"""train.compile=true compiles every graph in the first step and never again (issue 41): both
STDM modes, with and without the key-padding mask, over 20 steps of fresh masks; and the compiled
step computes what the eager one does.

Compilations are counted with torch's own counters (torch._dynamo.utils.counters: the graphs
dynamo captured, the frames it compiled, the forward/backward graphs AOT autograd built). A
recompilation shows in all three: before the fix, bernoulli STDM's second visible length
recompiled the blocks as dynamic at step 3 (7 s on CPU, 4-6 s on an H200)."""
import pytest
import torch
import torch._dynamo.utils as dynamo_utils

from coreecg.methods import CoReECG
from coreecg.train.step import PretrainStep, Schedule
from tests.helpers import tiny_config

STEPS = 20
# Inductor's CPU kernels reorder reductions and fuse what eager runs apart; Adam turns rounding
# in near-zero gradients into ±lr updates, so 20 steps drift by ~1e-5 relative (measured 2e-6
# .. 3e-5 here). 1e-3 is 30x that and 100x below a real change (tau 0.2 -> 0.21 moves loss_con ~1 %).
RTOL = 1e-3


def _compilations() -> dict[str, int]:
    c = dynamo_utils.counters
    return {"graphs": c["stats"]["unique_graphs"], "frames": c["frames"]["total"],
            "aot_graphs": sum(c["aot_autograd"].values())}


def _losses(mode: str, padded: bool, compiled: bool) -> tuple[list[float], list[dict[str, int]]]:
    cfg = tiny_config("train.precision=fp32", f"methods.core.masking.mode={mode}",
                      f"train.compile={str(compiled).lower()}")
    torch.manual_seed(0)
    model = CoReECG(cfg)
    step = PretrainStep(model, cfg, Schedule(STEPS, 1, 0))
    step.unpadded = not padded            # no padding: exact STDM then runs with no attention mask at all
    x = torch.randn(4, cfg.model.n_leads, cfg.model.input_samples, generator=torch.Generator().manual_seed(1))
    if padded:
        x[1, :, -3 * cfg.patch_size:] = float("nan")    # a short record: the key-padding mask is on
    gen, losses, counts = torch.Generator(), [], []
    for i in range(STEPS):
        gen.manual_seed(1000 + i)         # fresh masks every step, the same for eager and compiled
        losses.append(float(step(x, generator=gen)["loss"]))
        counts.append(_compilations())
    return losses, counts


@pytest.mark.slow
@pytest.mark.parametrize("mode,padded", [("bernoulli", False), ("bernoulli", True), ("exact", False),
                                         ("exact", True)])
def test_the_compiled_step_compiles_once_and_matches_eager(mode, padded):
    torch._dynamo.reset()
    eager, _ = _losses(mode, padded, compiled=False)
    compiled, counts = _losses(mode, padded, compiled=True)
    assert counts[0]["graphs"] > 0, "the first step compiled nothing: the counters do not see torch.compile"
    assert all(c == counts[0] for c in counts[1:]), f"recompiled after the first step: {counts}"
    assert compiled == pytest.approx(eager, rel=RTOL), (compiled, eager)


def test_bernoulli_visible_sets_always_carry_the_padding_mask():
    """Bernoulli STDM marks its visible length dynamic and always passes the mask, also when a
    batch happens to draw equal counts, and pads the length to a multiple of 8: no batch may
    switch the compiled graph (on CUDA, inductor guards on the mask's alignment: the H200 run
    recompiled at step 3 when the length's alignment flipped)."""
    from coreecg.model.encoder import Encoder
    from coreecg.model.padding import unpadded

    enc = Encoder(n_leads=3, n_patches=4, patch_size=5, dim=8, depth=1, num_heads=2)
    visible = torch.zeros(2, 3, 4, dtype=torch.bool)
    visible[:, 0, :2] = True                                    # equal counts: 2 and 2
    x = torch.randn(2, 3, 20)
    with unpadded():                                            # a batch known to hold no short record
        fixed = enc(x, visible=visible)
        out = enc(x, visible=visible, varying=True)
    assert fixed.valid is None                                  # fixed-count masks: no mask, flash attention
    # Padded to a multiple of 8 (CUDA's mask alignment, which inductor guards on): 2 -> 8 tokens
    assert out.tokens.shape[1] == 8 and out.valid.tolist() == [[True] * 2 + [False] * 6] * 2
    assert torch.allclose(out.tokens[:, :2], fixed.tokens, atol=1e-6)   # the same numbers
    assert torch.equal(out.index[:, :2], fixed.index)



def test_compile_auto_is_on_for_cuda_only_and_a_set_value_wins():
    """train.compile=auto (the default): compiled where the model trains on CUDA, eager on the CPU;
    true/false are kept on either (coreecg.train.speed.compile_enabled)."""
    from coreecg.config import load_config
    from coreecg.train.speed import compile_enabled

    from coreecg.train import speed

    train = load_config(None, []).train
    assert train.compile == "auto"
    with pytest.MonkeyPatch.context() as mp:     # a CUDA device, named only: nothing runs on it
        mp.setattr(speed, "inductor_supports", lambda device: True)
        assert compile_enabled(train, torch.device("cuda")) and not compile_enabled(train, torch.device("cpu"))
        mp.setattr(speed, "inductor_supports", lambda device: False)    # no Triton, or a pre-Volta GPU
        assert not compile_enabled(train, torch.device("cuda"))
        assert compile_enabled(load_config(None, ["train.compile=true"]).train, torch.device("cuda"))
    with pytest.MonkeyPatch.context() as mp:     # no C compiler for Triton's launchers: not supported
        mp.setattr(speed.shutil, "which", lambda name: None)
        assert speed.inductor_supports(torch.device("cuda")) is False
    for value, expected in (("true", True), ("false", False)):
        t = load_config(None, [f"train.compile={value}"]).train
        assert t.compile is expected
        assert compile_enabled(t, torch.device("cpu")) is expected
        assert compile_enabled(t, torch.device("cuda")) is expected
    # the CPU default builds an eager step: nothing compiled
    cfg = tiny_config()
    step = PretrainStep(CoReECG(cfg), cfg, Schedule(STEPS, 1, 0))
    assert step.bare.compiled is False
    assert not any(getattr(m, "_compiled_call_impl", None) is not None for m in step.bare.modules())


@pytest.mark.slow
def test_a_compiled_run_records_no_graph_built_after_its_first_step(tmp_path, monkeypatch):
    """Through the training loop (the one every job runs): a compiled pretraining of two epochs of
    fresh bernoulli masks, with the probe at init and after each epoch, records in metrics.jsonl
    that its first step was compiled and that no graph was built in a training step after it;
    jobs/pretrain.py's speed line says so. Evaluation runs eager (coreecg.train.speed.uncompiled):
    the probe at init builds no graph before the first step, and nothing after it builds any."""
    import json

    import ray

    from coreecg.train import fit as fitmod
    from coreecg.train.fit import fit
    from coreecg.train.pretraining import PretrainTask, plan_pretrain
    from coreecg.train.run_speed import run_speed, speed_line
    from coreecg.train.speed import graphs_compiled
    from tests.helpers import build_synthetic

    at_start = []
    real_start = PretrainTask.start

    def start(self, bare, ctx, writer):
        before = graphs_compiled()
        out = real_start(self, bare, ctx, writer)
        at_start.append((before, graphs_compiled(), out))
        return out

    monkeypatch.setattr(PretrainTask, "start", start)

    corpus = build_synthetic(tmp_path / "corpus", 32, 3)
    out = tmp_path / "run"
    cfg = tiny_config(f"data.corpus={corpus}", "data.cache_in_memory_gb=0", "optim.batch_size=4", "optim.epochs=2",
                      "optim.warmup_epochs=0", "train.eval_every_epochs=1", "train.figures=false",
                      f"data.probe_corpus={corpus}", "data.probe_max_windows=16",
                      "train.num_workers=1", "train.compile=true", f"train.storage_path={out.parent}",
                      f"train.name={out.name}")
    monkeypatch.setattr(fitmod, "start_ray", lambda config: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    torch._dynamo.reset()
    graphs_before = graphs_compiled()        # dynamo's counters are per process: other tests' graphs
    fit(plan_pretrain(cfg), report_fn=lambda metrics: None)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if r.get("event") == "first_step")
    assert first["compiled"] is True and first["graphs"] > 0
    epochs = [r for r in records if r.get("kind") == "epoch"]
    assert len(epochs) == 2 and all(r["graphs_compiled_after_first_step"] == 0 for r in epochs)
    assert all("probe_auroc" in r for r in epochs)     # evaluated between the epochs
    (before, after, started), = at_start
    assert "probe_auroc_init" in started and after == before, "the probe at init built graphs"
    assert graphs_compiled() - graphs_before == first["graphs"], "evaluation or the run's end built graphs"
    assert [r["phase"] for r in records if r.get("event") == "startup"] == ["workers", "task", "model", "start",
                                                                             "batch"]
    phases = run_speed(out, since=0.0)["startup_s"]
    assert list(phases)[-5:] == ["task", "model", "start", "batch", "first step"] and min(phases.values()) >= 0
    speed = run_speed(out, since=0.0)
    assert speed["graphs_compiled_after_first_step"] == 0
    assert "compiled: 0 graph(s) built after the first step" in speed_line(speed)
