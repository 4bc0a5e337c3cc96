"""One pretraining step, reused by every loop (plain PyTorch, Ray Train workers, Tune trials)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from coreecg.config import Config
from coreecg.devices import autocast
from coreecg.model.padding import unpadded
from coreecg.train.optim import adamw, build_optimizer, cosine_lr, ema_momentum, param_groups
from coreecg.train.speed import apply_speed_options


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


class TrainStep:
    """forward -> backward -> (clip) -> AdamW step -> (EMA teacher update), with a per-iteration
    cosine lr (and, for pretraining, the EMA momentum schedule). Pretraining and fine-tuning
    share it; the model's forward returns a dict with "loss" (plus anything to log).

    `model` may be wrapped (e.g. DistributedDataParallel); `bare` is the unwrapped module whose
    teacher (if `ema` is given) gets the EMA update.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Schedule, *, lr: float,
                 min_lr: float, grad_clip: float, precision: str, ema: tuple[float, float] | None = None,
                 bare: nn.Module | None = None):
        self.model, self.optimizer, self.schedule = model, optimizer, schedule
        self.bare = bare if bare is not None else model
        self.lr, self.min_lr, self.grad_clip, self.precision, self.ema = lr, min_lr, grad_clip, precision, ema
        self.step = 0
        # True when the training split is known to hold no short-record padding (its manifest's
        # count): attention then runs without a key-padding mask where it can (coreecg.model.padding).
        self.unpadded = False

    def __call__(self, *inputs: torch.Tensor, **kwargs) -> dict[str, torch.Tensor]:
        """inputs: the model's (e.g. x (B, C, T) on the model's device). Returns the model's
        output dict (loss detached) plus lr, grad_norm (and ema_momentum)."""
        s = self.schedule
        lr = cosine_lr(self.step, s.total_steps, s.warmup_steps, self.lr, self.min_lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)     # layer-wise decay: a factor per group
        self.model.train()
        if getattr(self.bare, "cuda_graphs", False):     # this step's CUDA-graph outputs may reuse the last's memory
            torch.compiler.cudagraph_mark_step_begin()
        x = inputs[0]
        with autocast(self.precision, x.device), unpadded(self.unpadded):
            out = self.model(*inputs, **kwargs)
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        if self.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:
            grads = [p.grad for p in params if p.grad is not None]
            grad_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) if grads else torch.zeros(())
        self.optimizer.step()
        out["loss"] = out["loss"].detach()
        out.update(lr=torch.tensor(lr), grad_norm=grad_norm.detach())
        if self.ema is not None:
            m = ema_momentum(self.step, s.total_steps, *self.ema)
            self.bare.update_teacher(m)
            out["ema_momentum"] = torch.tensor(m)
        self.step += 1
        return out

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:   # a checkpoint from an unfused optimiser keeps its flags
            group["fused"], group["foreach"] = self.optimizer.defaults["fused"], self.optimizer.defaults["foreach"]
        self.step = int(state["step"])


class PretrainStep(TrainStep):
    """The pretraining step of any method (coreecg.methods): AdamW over what requires grad (optim
    section), then the EMA update of the method's momentum targets, if it has any."""

    def __init__(self, model: nn.Module, config: Config, schedule: Schedule, bare: nn.Module | None = None):
        bare = apply_speed_options(bare if bare is not None else model, config.train)
        o = config.optim
        super().__init__(model, build_optimizer(bare, o), schedule, lr=o.lr, min_lr=o.min_lr,
                         grad_clip=o.grad_clip, precision=config.train.precision,
                         ema=bare.ema_schedule(), bare=bare)
        self.config = config


class FinetuneStep(TrainStep):
    """The downstream step: AdamW (finetune lr, or linear_lr in the head-only modes; weight decay,
    layer-wise lr decay; optim betas, min_lr, clip) over whatever requires grad (the head alone in
    linear mode), no EMA."""

    def __init__(self, model: nn.Module, config: Config, schedule: Schedule, bare: nn.Module | None = None):
        bare = apply_speed_options(bare if bare is not None else model, config.train)
        f, o = config.finetune, config.optim
        optimizer = adamw(param_groups(bare, f.weight_decay, f.layer_decay), f.step_lr, o.betas)
        super().__init__(model, optimizer, schedule, lr=f.step_lr, min_lr=o.min_lr, grad_clip=o.grad_clip,
                         precision=config.train.precision, bare=bare)
        self.config = config
