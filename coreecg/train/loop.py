"""Plain-PyTorch pretraining loop over in-memory windows (no Ray): the quickstart path and
the reference that the Ray Train loop must match."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from coreecg.config import Config
from coreecg.model import CoReECG
from coreecg.train.checkpoint import load_checkpoint, save_checkpoint
from coreecg.train.step import PretrainStep, Schedule


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def random_crop(x: torch.Tensor, length: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random `length`-sample window of each sample, one offset per sample: (B, C, T) -> (B, C, length)."""
    B, C, T = x.shape
    if length > T:
        raise ValueError(f"cannot crop {length} samples from windows of {T}")
    offsets = torch.randint(0, T - length + 1, (B,), generator=generator, device=generator.device if generator else "cpu")
    idx = offsets.to(x.device)[:, None] + torch.arange(length, device=x.device)[None, :]
    return torch.take_along_dim(x, idx[:, None, :].expand(B, C, length), dim=2)


def pretrain_local(config: Config, windows: np.ndarray, output_dir: str | Path | None = None) -> dict:
    """Pretrain on `windows` (n, C, T_stored) float32 for config.optim.epochs epochs.

    Writes to output_dir: config.yaml, metrics.jsonl, TensorBoard events, checkpoint.pt
    (every epoch, atomically). Re-running with the same output_dir resumes from
    checkpoint.pt. Returns the last epoch's mean metrics.
    """
    from tensorboardX import SummaryWriter

    out = Path(output_dir or config.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config.to_yaml(out / "config.yaml")
    device = resolve_device(config.train.device)
    torch.manual_seed(config.train.seed)
    gen = torch.Generator().manual_seed(config.train.seed)                       # order and crops (CPU)
    step_gen = torch.Generator(device).manual_seed(config.train.seed + 1)       # masks and FDA noise

    data = torch.from_numpy(np.ascontiguousarray(windows, dtype=np.float32))
    bs = min(config.optim.batch_size, len(data))
    steps_per_epoch = len(data) // bs
    if steps_per_epoch == 0:
        raise ValueError(f"{len(data)} windows are fewer than one batch of {config.optim.batch_size}")
    model = CoReECG(config).to(device)
    step = PretrainStep(model, config, Schedule(steps_per_epoch, config.optim.epochs, config.optim.warmup_epochs))
    start_epoch = 0
    ckpt_path = out / "checkpoint.pt"
    if ckpt_path.exists():
        payload, saved = load_checkpoint(ckpt_path, device)
        if saved.to_dict() != config.to_dict():
            raise ValueError(f"{ckpt_path} was written with a different config; use a new output_dir")
        model.load_state_dict(payload["model"])
        step.load_state_dict(payload["trainer"])
        start_epoch = int(payload["epoch"]) + 1
        gen.set_state(payload["generator"])
        step_gen.set_state(payload["step_generator"])

    writer = SummaryWriter(str(out / "tensorboard"))
    summary: dict = {}
    with open(out / "metrics.jsonl", "a") as log:
        for epoch in range(start_epoch, config.optim.epochs):
            t0 = time.perf_counter()
            perm = torch.randperm(len(data), generator=gen)
            sums: dict[str, torch.Tensor] = {}
            for i in range(steps_per_epoch):
                batch = random_crop(data[perm[i * bs:(i + 1) * bs]], config.data.crop_samples, gen).to(device)
                metrics = step(batch, generator=step_gen)
                for k, v in metrics.items():     # summed on the device: no host sync per step
                    sums[k] = sums.get(k, 0) + v.float().to(device)
                if step.step % config.train.log_every == 0:
                    for k, v in metrics.items():
                        writer.add_scalar(f"pretrain/{k}", float(v), step.step)
            summary = {k: float(v) / steps_per_epoch for k, v in sums.items()}
            summary.update(epoch=epoch, step=step.step, seconds=time.perf_counter() - t0,
                           samples_per_s=steps_per_epoch * bs / (time.perf_counter() - t0))
            log.write(json.dumps(summary) + "\n")
            log.flush()
            save_checkpoint(ckpt_path, model, config, trainer=step.state_dict(), epoch=epoch,
                            generator=gen.get_state(), step_generator=step_gen.get_state(), metrics=summary)
    writer.close()
    return summary
