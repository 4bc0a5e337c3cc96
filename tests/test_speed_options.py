"""The speed and memory options do what they claim (their numerics: tests/test_step_numerics.py)."""
import subprocess
import sys

import pytest
import torch

from coreecg.methods import CoReECG
from coreecg.model.classifier import Classifier
from coreecg.model.layers import Transformer
from coreecg.train.step import FinetuneStep, PretrainStep, Schedule
from tests.helpers import tiny_config
from tests.step_reference import CASES, REFERENCE, fingerprint


def _saved_bytes(model: CoReECG, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward during one forward."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, generator=torch.Generator().manual_seed(0))["loss"]
    return total


def test_activation_checkpointing_keeps_a_fraction_of_the_activations():
    cfg = tiny_config()
    x = torch.randn(4, 12, 2250)
    plain = _saved_bytes(CoReECG(cfg), x)
    model = CoReECG(cfg)
    PretrainStep(model, tiny_config("train.activation_checkpointing=true"), Schedule(1, 1, 0))
    assert all(m.checkpointing for m in model.modules() if isinstance(m, Transformer))
    kept = _saved_bytes(model, x)
    assert kept < 0.35 * plain, (kept, plain)


def test_checkpointing_is_off_outside_autograd(monkeypatch):
    """Evaluation (no_grad) runs the blocks plainly; under autograd every block is checkpointed."""
    import coreecg.model.layers as layers

    calls = []
    real = layers.checkpoint
    monkeypatch.setattr(layers, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = tiny_config("train.activation_checkpointing=true")
    model = CoReECG(cfg)
    PretrainStep(model, cfg, Schedule(1, 1, 0))
    x = torch.randn(2, 12, 2250)
    with torch.no_grad():
        model.encoder.pooled(x)
    assert calls == []
    model.encoder.pooled(x)
    assert len(calls) == cfg.encoders.coreecg.depth


def test_adamw_is_fused_for_pretraining_and_finetuning():
    cfg = tiny_config()
    step = PretrainStep(CoReECG(cfg), cfg, Schedule(1, 1, 0))
    assert step.optimizer.defaults["fused"] is True
    clf = Classifier(CoReECG(cfg).encoder, 5, cfg.finetune.leads, multilabel=False)
    assert FinetuneStep(clf, cfg, Schedule(1, 1, 0)).optimizer.defaults["fused"] is True


_CYCLES = """
import resource, sys, torch
from coreecg.train.speed import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
for i in range(3):                                    # the heap's growth to two blocks is not counted
    torch.empty(64 << 20).fill_(0.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(12):                                   # a step's activations: allocate, write, free
    torch.empty(64 << 20).fill_(float(i))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_resumed_optimiser_stays_fused():
    """A checkpoint written by an unfused AdamW (before issue 10) must not turn fusing off."""
    cfg = tiny_config()
    model = CoReECG(cfg)
    step = PretrainStep(model, cfg, Schedule(1, 1, 0))
    step.load_state_dict({"optimizer": step.optimizer.state_dict() | {"param_groups": [
        {**g, "fused": False, "foreach": False} for g in step.optimizer.state_dict()["param_groups"]]}, "step": 3})
    assert all(g["fused"] is True for g in step.optimizer.param_groups) and step.step == 3


def _thp_always() -> bool:
    try:
        return "[always]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
@pytest.mark.skipif(_thp_always(), reason="transparent huge pages fault 2 MB at a time: the counts below assume 4 KB")
def test_freed_host_memory_is_reused_without_page_faults():
    """glibc unmaps a freed 256 MB block, so each re-allocation faults its 65k pages again;
    after keep_freed_memory the blocks come back from the heap (after at most a few growths: a
    small allocation may land in a freed block)."""
    faults = {mode: int(subprocess.run([sys.executable, "-c", _CYCLES, mode], capture_output=True, text=True,
                                       check=True).stdout) for mode in ("default", "keep")}
    assert faults["default"] > 11 * 60_000, faults        # every cycle faults afresh
    assert faults["keep"] < 0.35 * faults["default"], faults   # bounded: a few heap growths, then none


@pytest.mark.slow
def test_compiled_blocks_reproduce_the_reference_step():
    """train.compile=true (inductor, each Block) changes the kernels, not the numbers."""
    import json

    from tests.test_step_numerics import RTOL_UPDATE, _close, _compare

    want = json.loads(REFERENCE.read_text())["cases"]["core_bernoulli_axial"]
    got = fingerprint(CASES["core_bernoulli_axial"] + ["train.compile=true"])
    assert _close(got["outputs"]["loss"], want["outputs"]["loss"], abs(want["outputs"]["loss"]))
    problems = _compare("grad", got["grads"], want["grads"]) + \
        _compare("update", got["updates"], want["updates"], RTOL_UPDATE)
    assert not problems, "\n".join(problems[:20])
