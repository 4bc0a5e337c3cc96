"""The GPU path (skipped without a CUDA device; bench/gpu_smoke.sh runs it on a lent GPU)."""
import pytest
import torch

from coreecg.methods import CoReECG
from coreecg.train.step import PretrainStep, Schedule
from tests.helpers import tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _step(*overrides: str) -> tuple[PretrainStep, torch.Tensor]:
    cfg = tiny_config("train.precision=auto", *overrides)
    torch.manual_seed(0)
    model = CoReECG(cfg).cuda()
    return PretrainStep(model, cfg, Schedule(10, 2, 0)), torch.randn(16, 12, 2250, device="cuda")


def test_cuda_step_makes_no_host_sync():
    """bf16 autocast, fused AdamW, masks planned on the host: a step never waits on the GPU."""
    step, x = _step()
    gen = torch.Generator().manual_seed(0)       # the training loop's: on the host
    step(x, generator=gen)                       # lazy initialisation may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = step(x, generator=gen)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert step.optimizer.defaults["fused"] is True
    assert torch.isfinite(out["loss"]).item()


def test_cuda_checkpointing_lowers_peak_memory():
    peaks = {}
    for on in (False, True):
        step, x = _step(f"train.activation_checkpointing={str(on).lower()}")
        gen = torch.Generator().manual_seed(0)
        step(x, generator=gen)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(x, generator=gen)
        torch.cuda.synchronize()
        peaks[on] = torch.cuda.max_memory_allocated()
        del step, x
        torch.cuda.empty_cache()
    assert peaks[True] < 0.8 * peaks[False], peaks
