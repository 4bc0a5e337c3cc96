"""The model, optimisation and training sections: the encoder and its input, the optimiser, and where
and how a run trains (a method's own options: its section methods.<name>, coreecg/methods)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from coreecg.config.base import ConfigError

AUTO = "auto"          # train.use_gpu, train.num_workers (from the cluster's GPUs) and train.compile (TrainConfig)
CPU_WORKERS = 2        # train.num_workers=auto where the run trains on the CPU


@dataclass
class ModelConfig:
    """What the encoder reads (paper: Implementation Details): which encoder, and its input. The
    encoder's sizes are its own section, `encoders.<arch>` (the paper's ViT: `encoders.coreecg`);
    a method's decoders and heads: its section `methods.<name>`."""

    # Which registered encoder (coreecg.encoders): the paper's ViT, xresnet1d, s4, a plugin's, or a
    # published family (st_mem) whose sizes `encoders.<arch>` are read from its weights.
    arch: str = "coreecg"
    n_leads: int = 12
    input_samples: int = 2250


@dataclass
class OptimConfig:
    lr: float = 1.5e-4
    min_lr: float = 0.0
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_epochs: float = 5.0
    epochs: int = 80
    batch_size: int = 256
    grad_clip: float = 0.0            # 0 disables clipping
    # Every contrastive method's negatives pool (one key, so compared methods share it): true,
    # the global batch (every rank's rows; the paper's batch of 256); false, each rank's own batch.
    gather_negatives: bool = True


@dataclass
class InferenceConfig:
    """How a trained model scores records: jobs/predict.py, coreecg.embed / coreecg.predict and the
    precision check of jobs/export.py (coreecg/inference/precision.py, docs/inference.md "Precision").
    `--precision` on those commands sets `precision`; the bounds decide which paths a model keeps."""

    # auto: bf16 on CUDA, and on a CPU with bf16 matrix units (AVX-512 BF16 / AMX, detected) unless
    # the model's check refused it; else fp32. int8 (dynamic, Linear layers): only when asked for.
    precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    threads: int = 0                  # torch intra-op threads of one process; 0: torch's default (the cores)
    # torch.compile of the model's feature pass, its weights frozen into the graph (inductor
    # `freezing`: prepacked matrix weights, fused bias and GELU), for a compilation of 8-60 s:
    # 1.17x xresnet1d's records/s on a CPU with AMX, 0.8-1.06x the ViT's and S4's (docs/performance.md).
    # auto: on a CPU for a run of at least compile_min_windows windows (a file: at least one; a
    # corpus shard: its rows), keeping the faster of the
    # compiled and the eager pass as its first passes time them (fp32 and bf16; int8 stays eager).
    compile: bool | Literal["auto"] = "auto"           # as train.compile: auto, true or false
    compile_min_windows: int = 2000
    # The CPU bf16 path's fusions (coreecg/inference/fused.py): BatchNorm folded into the convolution
    # before it, Linear and runs of 1x1 convolutions as oneDNN products with their bias and GELU:
    # 1.06-1.10x the ViT's records/s, 1.10x xresnet1d's, 1.22x S4's on a Xeon with AMX, the same bf16 numbers;
    # false: torch's own layers (docs/inference.md "Precision").
    fuse: bool = True
    # A path is refused for a model whose outputs differ from float32's by more than these (measured,
    # docs/performance.md "CPU inference precision"): the macro AUROC on a held-out test split,
    # a probability, and an embedding (its L2 distance over the float32 embedding's L2 norm).
    max_auroc_drop: float = 0.005     # 0.5 AUROC points
    max_probability_diff: float = 0.02
    max_embedding_diff: float = 0.05

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ConfigError(f"inference.threads={self.threads} must be >= 0 (0: torch's default)")
        if self.compile_min_windows < 1:
            raise ConfigError(f"inference.compile_min_windows={self.compile_min_windows} must be >= 1")
        for key in ("max_auroc_drop", "max_probability_diff", "max_embedding_diff"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"inference.{key}={getattr(self, key)} must be > 0")


@dataclass
class TrainConfig:
    """Where and how a run trains. Ray Train: `num_workers` data-parallel workers (DDP),
    each with `cpus_per_worker` CPUs and one GPU when `use_gpu`; outputs go to
    `<storage_path>/<name>/`, and re-running with the same storage_path and name resumes.

    `use_gpu` and `num_workers` default to "auto": `coreecg.cluster.plan_devices` resolves them
    once, before the run starts, from the GPUs of the cluster it runs on (the GPUs when there are
    some, one worker per GPU; else the CPU and 2 workers). A value set anywhere (a config file,
    --set, a study's or sweep's overrides, a saved config) is kept as it is. The run folder's
    config.yaml and run.json hold the resolved values. `compile` defaults to "auto" too, decided on
    the worker where its device is known (coreecg.train.speed.compile_enabled: on CUDA, not on the
    CPU); metrics.jsonl's first_step record says whether the step was compiled."""

    seed: int = 0
    device: str = "auto"              # plain (no-Ray) loop and benchmarks only: auto | cpu | cuda
    precision: Literal["auto", "fp32", "bf16"] = "auto"   # auto: bf16 autocast on CUDA, fp32 on CPU
    log_every: int = 10               # steps between logged step metrics
    progress_every_s: float = 30.0    # a progress line within an epoch (step, samples/s, ETA); 0: none
    num_workers: int | Literal["auto"] = "auto"     # auto: one per GPU, or CPU_WORKERS on the CPU
    use_gpu: bool | Literal["auto"] = "auto"        # auto: true where the cluster has a GPU per worker
    cpus_per_worker: int = 1
    checkpoint_every_steps: int = 500  # 0: only at epoch ends
    keep_checkpoints: int = 3
    max_failures: int = 3             # worker-group restarts from the last checkpoint
    eval_every_epochs: int = 1        # probe + reconstruction figure; 0 disables
    # A collapse (coreecg.eval.objectives.collapse_reason): RankMe under this, or embeddings whose
    # spread is ~0, is a named warning at each evaluation; stop_on_collapse: a sweep stops the trial
    collapse_rankme: float = 2.0
    stop_on_collapse: bool = False
    figures: bool = True              # the reconstruction figure at eval epochs (1.5-2 s each at tiny
                                      # scale: sweeps turn it off, configs/sweep.yaml)
    # Speed and memory (coreecg/train/speed.py, docs/performance.md); none changes the numbers.
    host_memory_cache: bool = True    # CPU: keep freed activation memory instead of re-faulting it
    activation_checkpointing: bool = False   # recompute transformer blocks in backward: less memory
    # torch.compile each transformer block (inductor). Every graph compiles in the first step
    # (tests/test_compile_once.py). auto: on where the model trains on a CUDA device, off on the CPU
    # (coreecg.train.speed.compile_enabled; measured, docs/decisions.md "Compiled step").
    compile: bool | Literal["auto"] = "auto"
    # torch.compile's mode: "reduce-overhead" adds CUDA graphs, one per shape (and per visible length).
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    storage_path: str = "runs"        # on a multi-node cluster: a shared filesystem path
    # Object storage: the run folder mirrored to <mirror_uri>/<name>/ through pyarrow filesystems
    # after every epoch and at the end, and pulled back to resume where the folder has no
    # checkpoint (s3://, gs://, hdfs://, abfs://, file://; coreecg/train/mirror.py). "": none.
    mirror_uri: str = ""
    name: str = "pretrain"
    # The method name under which downstream tables list encoders from this run; "" = the
    # pretraining method's registered label. Ablation variants set their own.
    variant: str = ""
    # Experiment tracking beside the run folder: "mlflow" or "wandb" logs the config as params and
    # every epoch's metrics through Ray's integrations (pip install coreecg[mlflow] / [wandb]);
    # sweeps and studies track each trial as one run (coreecg/train/tracking.py).
    tracking: Literal["none", "mlflow", "wandb"] = "none"
    tracking_uri: str = ""            # "": MLflow a file store at <storage_path>/mlruns, W&B offline files
    tracking_experiment: str = "coreecg"      # the MLflow experiment, the W&B project
    tracking_group: str = ""          # the sweep's or study's name (its trials set it); "": none

    def __post_init__(self) -> None:
        if self.progress_every_s < 0:
            raise ConfigError(f"train.progress_every_s={self.progress_every_s} must be >= 0 (0: no progress lines)")
        if (self.num_workers != AUTO and self.num_workers < 1) or self.cpus_per_worker < 1:
            raise ConfigError("train.num_workers and train.cpus_per_worker must be >= 1")
        if min(self.checkpoint_every_steps, self.max_failures, self.eval_every_epochs) < 0 \
                or self.keep_checkpoints < 1 or self.log_every < 1:
            raise ConfigError("train.checkpoint_every_steps, max_failures, eval_every_epochs must be >= 0; "
                              "keep_checkpoints and log_every >= 1")
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"train.name={self.name!r} must be a plain folder name")
        if "://" in self.storage_path:
            raise ConfigError(
                f"train.storage_path={self.storage_path}: a URI; the run folder (metrics.jsonl, "
                "checkpoints, encoder) is written with POSIX file operations, so it must be a path "
                "every node mounts (NFS/EFS/Filestore/Lustre). For object storage keep it a path "
                f"and set train.mirror_uri={self.storage_path} (docs/cluster.md \"Shared storage\")")
        if self.mirror_uri and "://" not in self.mirror_uri:
            raise ConfigError(f"train.mirror_uri={self.mirror_uri}: expected a URI such as s3://bucket/runs "
                              "or file:///path (\"\" for no mirror)")
        # Relative to where the command runs, fixed now: Ray Train's workers run in a working
        # folder of their own (artifacts/<name>), where "runs" would name another folder.
        self.storage_path = str(Path(self.storage_path).expanduser().resolve())

    @property
    def run_dir(self) -> Path:
        return Path(self.storage_path).expanduser().resolve() / self.name

    @property
    def devices_resolved(self) -> bool:
        """Whether use_gpu and num_workers are concrete (set, or resolved by
        coreecg.cluster.plan_devices): what the planners, Ray Train and Tune need."""
        return AUTO not in (self.use_gpu, self.num_workers)
