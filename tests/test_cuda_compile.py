"""The compiled step on CUDA (skipped without a CUDA device; bench/lease/run.sh runs it on a lent
GPU): it compiles in the first step only, in both STDM modes, with and without the key-padding
mask, with CUDA graphs too, and computes what eager does (bf16 autocast, so a looser tolerance)."""
import pytest
import torch

from tests.test_compile_once import _compilations

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

STEPS = 12
RTOL = 2e-2          # bf16 autocast: eager and inductor round differently (measured well under 1 %)


def _run(*overrides: str, padded: bool = False) -> tuple[list[float], list[dict[str, int]]]:
    from coreecg.methods import CoReECG
    from coreecg.train.step import PretrainStep, Schedule
    from tests.helpers import tiny_config

    cfg = tiny_config("train.precision=bf16", *overrides)
    torch.manual_seed(0)
    step = PretrainStep(CoReECG(cfg).cuda(), cfg, Schedule(STEPS, 1, 0))
    step.unpadded = not padded
    x = torch.randn(16, 12, 2250, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    if padded:
        x[3, :, -300:] = float("nan")
    gen, losses, counts = torch.Generator(), [], []
    for i in range(STEPS):
        gen.manual_seed(1000 + i)
        losses.append(float(step(x, generator=gen)["loss"]))
        counts.append(_compilations())
    return losses, counts


@pytest.mark.parametrize("mode,padded", [("bernoulli", False), ("bernoulli", True), ("exact", False), ("exact", True)])
@pytest.mark.parametrize("compile_mode", ["default", "reduce-overhead"])
def test_cuda_compiled_step_compiles_once_and_matches_eager(mode, padded, compile_mode):
    torch._dynamo.reset()
    eager, _ = _run(f"methods.core.masking.mode={mode}", "train.compile=false", padded=padded)
    compiled, counts = _run(f"methods.core.masking.mode={mode}", "train.compile=true",
                            f"train.compile_mode={compile_mode}", padded=padded)
    assert counts[0]["graphs"] > 0
    assert all(c == counts[0] for c in counts[1:]), f"recompiled after the first step: {counts}"
    assert compiled == pytest.approx(eager, rel=RTOL), (compiled, eager)


def test_the_default_compiles_on_cuda():
    """train.compile=auto: a CUDA step is compiled without any setting (issue 41)."""
    from coreecg.methods import CoReECG
    from coreecg.train.step import PretrainStep, Schedule
    from tests.helpers import tiny_config

    cfg = tiny_config()
    assert cfg.train.compile == "auto"
    step = PretrainStep(CoReECG(cfg).cuda(), cfg, Schedule(STEPS, 1, 0))
    assert step.bare.compiled is True
    assert any(getattr(m, "_compiled_call_impl", None) is not None for m in step.bare.modules())
