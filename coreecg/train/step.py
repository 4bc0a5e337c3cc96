"""One pretraining step, reused by every loop (plain PyTorch, Ray Train workers, Tune trials)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from coreecg.config import Config
from coreecg.train.optim import build_optimizer, cosine_lr, ema_momentum


@dataclass
class Schedule:
    """Step counts of a run: the lr and EMA schedules are per iteration."""

    steps_per_epoch: int
    epochs: int
    warmup_epochs: float

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    @property
    def warmup_steps(self) -> int:
        return int(round(self.warmup_epochs * self.steps_per_epoch))


def autocast(precision: str, device: torch.device):
    """bf16 autocast when asked for, or by default ("auto") on CUDA; fp32 otherwise."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class PretrainStep:
    """forward -> backward -> (clip) -> AdamW step -> EMA teacher update, with scheduled lr/momentum.

    `model` may be wrapped (e.g. DistributedDataParallel); `core` is the bare CoReECG whose
    teacher gets the EMA update.
    """

    def __init__(self, model: nn.Module, config: Config, schedule: Schedule, core: nn.Module | None = None):
        self.model, self.config, self.schedule = model, config, schedule
        self.core = core if core is not None else model
        self.optimizer = build_optimizer(self.core, config.optim)
        self.step = 0

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """x: (B, C, T) on the model's device. Returns the loss dict plus lr, momentum, grad_norm."""
        o, s = self.config.optim, self.schedule
        lr = cosine_lr(self.step, s.total_steps, s.warmup_steps, o.lr, o.min_lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        with autocast(self.config.train.precision, x.device):
            out = self.model(x, generator=generator)
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        if o.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
        else:
            grads = [p.grad for p in params if p.grad is not None]
            grad_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) if grads else torch.zeros(())
        self.optimizer.step()
        m = ema_momentum(self.step, s.total_steps, o.ema_momentum, o.ema_momentum_end)
        self.core.update_teacher(m)
        self.step += 1
        out["loss"] = out["loss"].detach()
        out.update(lr=torch.tensor(lr), ema_momentum=torch.tensor(m), grad_norm=grad_norm.detach())
        return out

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
