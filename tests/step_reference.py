"""A seeded fp32 pretraining step, summarised, to pin its numerics across performance work.

`fingerprint(overrides)` builds a tiny CoRe-ECG model, sets every parameter from a generator
seeded by the parameter's *name* (so a module reordering does not change the weights), runs
two `PretrainStep`s on a fixed input and returns: the forward outputs of the first step, and
per parameter its gradient after the first step and its total update after two steps (AdamW
and EMA included), each reduced to (norm, sum, 3 fixed random projections).

    python tests/step_reference.py       # rewrite tests/data/step_reference.json

The file was written by the code before issue 10's optimisations (commit bd76838); the test
(tests/test_step_numerics.py) recomputes the fingerprint with today's code and compares.
"""
from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coreecg.methods import CoReECG  # noqa: E402
from coreecg.train.step import PretrainStep, Schedule  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

REFERENCE = Path(__file__).parent / "data" / "step_reference.json"

# name -> overrides on top of tests.helpers.TINY (fp32 throughout).
CASES: dict[str, list[str]] = {
    "core_bernoulli_axial": ["methods.core.masking.mode=bernoulli"],
    "core_exact_joint": ["methods.core.masking.mode=exact", "methods.core.time_decoder.layout=joint"],
    "core_lead_layout": ["methods.core.time_decoder.layout=lead", "methods.core.latent_decoder.layout=lead"],
    "mae_random": ["methods.core.masking.strategy=random", "methods.core.loss.beta=0",
                   "methods.core.time_decoder.layout=joint"],
    "contrastive_only": ["methods.core.loss.alpha=0", "optim.grad_clip=1.0"],
}


def _gen(name: str, salt: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) + salt)


def named_init(model: torch.nn.Module) -> None:
    """Every parameter and buffer of the student side from a generator seeded by its name;
    the teacher is a copy of the student (as at real initialisation)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("teacher_encoder.", "teacher_projection.")):
                continue
            g = _gen(name)
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.ndim >= 2 and not name.startswith("fda."):
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        for student, teacher in model.student_teacher_pairs():
            teacher.load_state_dict(student.state_dict())


def _summary(t: torch.Tensor, name: str) -> list[float]:
    t = t.detach().double().flatten()
    if name.endswith("attn.qkv.bias"):
        # The key bias shifts every score of a query row equally, so softmax ignores it: its
        # gradient is zero up to rounding, and Adam turns that rounding into +-lr updates.
        third = t.numel() // 3
        t = torch.cat([t[:third], t[2 * third:]])
    proj = torch.randn((3, t.numel()), generator=_gen(name, 1), dtype=torch.float64)
    return [t.norm().item(), t.sum().item(), *(proj @ t).tolist()]


def fingerprint(overrides: list[str], batch: int = 6) -> dict:
    cfg = tiny_config("train.precision=fp32", *overrides)
    torch.manual_seed(0)
    model = CoReECG(cfg)
    named_init(model)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    step = PretrainStep(model, cfg, Schedule(steps_per_epoch=10, epochs=2, warmup_epochs=0.1))
    x = torch.randn((batch, cfg.model.n_leads, cfg.model.input_samples), generator=_gen("input"))
    gen = torch.Generator().manual_seed(1234)
    first = step(x, generator=gen)
    grads = {n: _summary(p.grad, n) for n, p in model.named_parameters() if p.grad is not None}
    step(x, generator=gen)
    updates = {n: _summary(p.detach() - start[n], n) for n, p in model.named_parameters()}
    return {"outputs": {k: float(v) for k, v in first.items() if v.ndim == 0},
            "grads": grads, "updates": updates}


def main() -> None:
    torch.set_num_threads(1)   # one reduction order
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    data = {"torch": torch.__version__, "cases": {name: fingerprint(o) for name, o in CASES.items()}}
    REFERENCE.write_text(json.dumps(data, indent=0))
    print(f"wrote {REFERENCE} ({REFERENCE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
