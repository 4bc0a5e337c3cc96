"""`--gpus-per-trial auto`: pack single-worker trials onto shared GPUs by the model's measured
memory.

A trial's need is measured, not guessed: one training step of the trial's config at two small
batches on the GPU (in a child process, so the sweep's driver keeps no CUDA context), whose peak
memories give the memory per sample and the fixed part (weights, optimiser state, workspace); the
need at the trial's batch is fixed + per_sample * batch, with HEADROOM for allocator
fragmentation and the varying visible counts of bernoulli STDM. As many trials as fit in a GPU's
memory then share it (Ray's fractional GPUs: 1/n each). A trial that fits in none is an error
naming the memory it needs and the memory there is.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from coreecg.config import Config, load_config

# Lazy imports: torch and the training step, in the functions that measure a GPU (in a child
# process): every job imports this module through coreecg.cli (--gpus-per-trial), and torch alone
# would add about 2 s to each job's --help (python -X importtime).

AUTO = "auto"
HEADROOM = 1.2            # measured peak x 1.2: fragmentation, varying visible counts, CUDA graphs' pools
USABLE = 0.92             # of a GPU's total memory: the CUDA context and the driver's own
PROBE_BATCHES = (4, 8)    # small: the measurement takes seconds and fits any GPU that can train at all


class GpuShareError(ValueError):
    """A trial that cannot fit on one GPU (exit 2 in the jobs)."""


@dataclass(frozen=True)
class MemoryModel:
    """Peak training memory at batch b: fixed + per_sample * b (bytes)."""

    fixed: float
    per_sample: float

    def need(self, batch: int) -> float:
        return (self.fixed + self.per_sample * batch) * HEADROOM


def parse_gpus_per_trial(value: str) -> float | str:
    """The --gpus-per-trial argument: a number of GPUs (0: none, 0.25: a quarter) or "auto"."""
    if value.strip().lower() == AUTO:
        return AUTO
    number = float(value)
    if number < 0:
        raise ValueError(f"--gpus-per-trial {value}: must be >= 0 or 'auto'")
    return number


def trials_per_gpu(config: Config, memory: MemoryModel, gpu_bytes: float, gpu_name: str = "the GPU") -> int:
    """How many trials of `config` (single-worker: its whole optim.batch_size on one device) fit in
    one GPU of `gpu_bytes`; GpuShareError when none does."""
    need = memory.need(config.optim.batch_size)
    usable = gpu_bytes * USABLE
    if need > usable:
        raise GpuShareError(
            f"--gpus-per-trial auto: a trial needs {need / 2**30:.1f} GiB at optim.batch_size="
            f"{config.optim.batch_size} ({memory.per_sample / 2**20:.1f} MiB a sample + "
            f"{memory.fixed / 2**30:.2f} GiB, "
            f"x{HEADROOM} headroom) but {gpu_name} has {gpu_bytes / 2**30:.1f} GiB ({usable / 2**30:.1f} usable); "
            "lower optim.batch_size, set train.activation_checkpointing=true, or use train.num_workers > 1")
    return max(1, math.floor(usable / need))


def auto_gpus_per_trial(config: Config, measure=None, gpu=None) -> tuple[float, str]:
    """(GPUs per trial, a line saying why) for `--gpus-per-trial auto`: 0 where the trial trains
    on the CPU (train.use_gpu false) or with several workers (each holds a whole GPU); else
    1 / trials_per_gpu. `measure(config) -> MemoryModel` and `gpu() -> (name, bytes)` default to
    the measurement on this machine's first GPU (tests pass their own)."""
    t = config.train
    if t.use_gpu is not True:
        return 0.0, "gpus per trial: none (the trials train on the CPU)"
    if t.num_workers != 1:
        return 1.0, f"gpus per trial: whole GPUs ({t.num_workers} Train workers, one GPU each)"
    name, total = (gpu or first_gpu)()
    memory = (measure or measure_memory)(config)
    n = trials_per_gpu(config, memory, total, name)
    return 1.0 / n, (f"gpus per trial: 1/{n} of {name} ({memory.need(config.optim.batch_size) / 2**30:.1f} GiB a trial "
                     f"measured at optim.batch_size={config.optim.batch_size}, {total / 2**30:.0f} GiB there)")


def first_gpu() -> tuple[str, float]:
    import torch

    props = torch.cuda.get_device_properties(0)
    return props.name, float(props.total_memory)


def measure_memory(config: Config) -> MemoryModel:
    """Peak memory of one training step at PROBE_BATCHES on this machine's GPU, in a child process."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        config.to_yaml(path)
        done = subprocess.run([sys.executable, "-m", "coreecg.tune.gpu_share", str(path)], capture_output=True,
                              text=True, timeout=900)
    if done.returncode != 0:
        raise GpuShareError(f"--gpus-per-trial auto: measuring a trial's memory failed: {done.stderr[-2000:]}")
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    (b1, p1), (b2, p2) = sorted((int(b), float(p)) for b, p in peaks.items())
    per_sample = max(0.0, (p2 - p1) / (b2 - b1))
    return MemoryModel(fixed=max(0.0, p1 - per_sample * b1), per_sample=per_sample)


def _peak_bytes(config_file: str) -> dict[int, int]:
    """In the child: the peak allocated memory of one pretraining step per probe batch."""
    import torch

    from coreecg.methods import build_method
    from coreecg.train.step import PretrainStep, Schedule

    peaks = {}
    for batch in PROBE_BATCHES:
        cfg = load_config(config_file, [f"optim.batch_size={batch}", "train.compile=false"])
        torch.manual_seed(0)
        model = build_method(cfg).cuda()
        step = PretrainStep(model, cfg, Schedule(2, 1, 0))
        x = torch.randn(batch, cfg.model.n_leads, cfg.model.input_samples, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        for _ in range(2):                     # the second step holds the optimiser's state too
            step(x, generator=torch.Generator().manual_seed(0))
        torch.cuda.synchronize()
        peaks[batch] = torch.cuda.max_memory_allocated()
        del model, step, x
        torch.cuda.empty_cache()
    return peaks


if __name__ == "__main__":
    sys.stdout.write(json.dumps(_peak_bytes(sys.argv[1])) + "\n")
