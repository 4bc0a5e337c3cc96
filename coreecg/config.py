"""One typed configuration for every hyperparameter of coreecg.

Defaults are the CoRe-ECG paper's values (Implementation Details; Datasets and
Preprocessing). Layers on top, in order: a YAML file, then `--set a.b=c` overrides, each read
by the typed loader (`coreecg.typed`): unknown keys and wrongly typed values are errors that
name the file (or "overrides") and the dotted key.

    cfg = load_config("run.yaml", overrides=["masking.p_time=0.6", "optim.lr=3e-4"])
    cfg.to_yaml("out/config.yaml")

A pretraining method's own section (`methods.<name>`), its checks and its structural keys are
declared in its module and registered with `coreecg.methods.register_method`; this module
holds the registry (`METHODS`) and names no method (docs/methods.md).
"""
from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

import yaml

from coreecg.typed import OpenSection, TypedError, field_type, load, override, read_yaml, to_plain

# The conventional 12-lead order (the paper's "I, II, III, aVR, aVL, aVF, V1-V6").
STANDARD_LEADS: tuple[str, ...] = (
    "I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6",
)


class ConfigError(TypedError):
    """A configuration key or value that cannot be accepted."""


# ---------------------------------------------------------------------------- sections


@dataclass
class PreprocessConfig:
    """How raw recordings become stored windows (paper: Datasets and Preprocessing)."""

    sampling_rate: int = 250          # Hz after resampling
    window_s: float = 10.0            # stored window length; 2,500 samples at 250 Hz
    # shorter records are quarantined; a record between this and window_s is kept as one window
    # padded at its end with NaN (the padding marker, docs/data_pipeline.md "Short records")
    min_duration_s: float = 5.0
    highpass_hz: float = 0.65
    lowpass_hz: float = 40.0
    filter_order: int = 4             # per Butterworth stage; sosfiltfilt doubles the effective order
    leads: tuple[str, ...] = STANDARD_LEADS
    zscore_eps: float = 1e-6          # flat leads z-score to zeros instead of dividing by ~0
    # z-score each window per lead over time (lead: the paper's) or over leads and time together
    # (record: ST-MEM's input contract, docs/published_encoders.md)
    standardize: Literal["lead", "record"] = "lead"
    # Known non-standard leads that are dropped (and noted in the record's meta), e.g. the
    # Frank leads vx, vy, vz of PTB Diagnostic; any other unknown lead quarantines the record.
    extra_leads: tuple[str, ...] = ("VX", "VY", "VZ")
    # Resampling uses exact rational factors up/down; a rate whose ratio to sampling_rate
    # needs a denominator above this (e.g. 257.3 Hz -> 2500/2573) is quarantined.
    resample_max_denominator: int = 1000

    def __post_init__(self) -> None:
        # messages without the section's key: the config's loader prefixes data.preprocess
        if not 0 < self.highpass_hz < self.lowpass_hz < self.sampling_rate / 2:
            raise ConfigError(f"need 0 < highpass_hz ({self.highpass_hz}) < lowpass_hz "
                              f"({self.lowpass_hz}) < sampling_rate/2 ({self.sampling_rate / 2})")
        if not self.min_duration_s > 0:
            raise ConfigError(f"min_duration_s={self.min_duration_s} must be > 0")
        if not self.leads or len(set(self.leads)) != len(self.leads) or not set(self.leads) <= set(STANDARD_LEADS):
            raise ConfigError(f"leads={self.leads} must be distinct names from {STANDARD_LEADS}")

    @property
    def window_samples(self) -> int:
        return int(round(self.window_s * self.sampling_rate))

    def settings(self) -> dict[str, Any]:
        """The settings a corpus records (manifest "preprocess", shard keys): every field, but
        standardize only when not the default, so corpora built before it existed still match."""
        out = dataclasses.asdict(self)
        if out["standardize"] == "lead":
            del out["standardize"]
        return out


@dataclass
class PTBXLOptions:
    label_view: Literal["single", "multi", "none"] = "single"   # single: the paper's 5-class task
    rate: Literal[500, 100] = 500                                # records500/ or records100/
    min_likelihood: float = 0.0                                  # SCP-code likelihood threshold
    # the benchmark's tasks (docs/data_sources.md); superdiagnostic + single = the paper's 5 classes
    task: Literal["superdiagnostic", "diagnostic", "subdiagnostic", "form", "rhythm", "all"] = "superdiagnostic"
    # patients: the patient hash at data.split_ratios; folds: strat_fold 1-8 / 9 / 10 = train / val / test
    split: Literal["patients", "folds"] = "patients"


@dataclass
class CPSC2018Options:
    # first: REFERENCE.csv's First_label, the challenge's primary label (the paper's 9-class
    # single-label task); single: records with one label only; multi: all labels; none: unlabelled
    label_view: Literal["first", "single", "multi", "none"] = "first"


@dataclass
class CinC2021Options:
    # auto: ningbo25 when subsets is exactly [Ningbo] (the paper's Ningbo task has 25 classes: AF
    # never occurs there, and a never-positive output would inflate micro ACC), else scored26
    class_map: Literal["auto", "scored26", "ningbo25", "frequent", "none"] = "auto"
    min_count: int = 1                # class_map=frequent: codes seen at least this often ...
    count_column: str = "Total"       # ... in this column of the challenge tables
    subsets: tuple[str, ...] = ()     # e.g. [Ningbo]; empty = every database found


@dataclass
class Code15Options:
    # multi: the six abnormalities + normal_ecg, 7 classes; none: unlabelled (pretraining)
    label_view: Literal["multi", "none"] = "multi"


@dataclass
class SourceOptions:
    """Reader options per source (the rest of the readers take none)."""

    ptbxl: PTBXLOptions = field(default_factory=PTBXLOptions)
    cpsc2018: CPSC2018Options = field(default_factory=CPSC2018Options)
    cinc2021: CinC2021Options = field(default_factory=CinC2021Options)
    code15: Code15Options = field(default_factory=Code15Options)
    synthetic_seed: int = 0

    def for_source(self, name: str, synthetic_records: int) -> dict[str, Any]:
        """Constructor options of `coreecg.data.sources.get_source(name, ...)`."""
        if name == "ptbxl":
            return dataclasses.asdict(self.ptbxl)
        if name == "cpsc2018":
            return dataclasses.asdict(self.cpsc2018)
        if name == "code15":
            return dataclasses.asdict(self.code15)
        if name == "cinc2021":
            opts = dataclasses.asdict(self.cinc2021)
            opts["subsets"] = list(opts["subsets"]) or None
            if opts["class_map"] == "auto":
                opts["class_map"] = "ningbo25" if opts["subsets"] == ["Ningbo"] else "scored26"
            return opts
        if name == "synthetic":
            return {"n_records": synthetic_records, "seed": self.synthetic_seed}
        return {}


@dataclass
class DataConfig:
    """What training reads. An empty `corpus` means the embedded synthetic corpus; a list of
    corpora is a pretraining mixture (docs/mixtures.md), drawn in `corpus_weights` proportions
    (empty: proportional to each corpus's train windows). A one-item list is that one path."""

    corpus: str | tuple[str, ...] = ""
    corpus_weights: tuple[float, ...] = ()
    crop_samples: int = 2250          # random crop of the stored 2,500 at training time
    synthetic_records: int = 512      # size of the embedded synthetic corpus
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    sources: SourceOptions = field(default_factory=SourceOptions)
    split_ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)  # train/val/test, by patient
    shard_records: int = 128          # records per corpus shard (the unit of resumption)
    # Where the embedded synthetic corpus is written as Parquet on first use (then reused).
    cache_dir: str = "corpora"
    # Training ingest (Ray Data): rows mixed across shards in each worker's shuffle buffer,
    # and the size below which the train split is held in the object store (no re-reads).
    shuffle_buffer: int = 2048
    cache_in_memory_gb: float = 2.0
    # Labelled corpus for the in-loop representation probe; empty = the training corpus when
    # it has labels (the synthetic corpus does), else no probe.
    probe_corpus: str = ""
    probe_max_windows: int = 1000     # per probe split (train, val): bounds the probe's cost
    # The probe fits on few labels: the mean over `probe_subsets` disjoint subsets of
    # `probe_labels_per_class` train windows per class (0: the whole probe train split). With
    # every label, random encoder features already saturate (docs/decisions.md).
    probe_labels_per_class: int = 10
    probe_subsets: int = 5

    @property
    def corpora(self) -> tuple[str, ...]:
        """data.corpus as a tuple: () for the embedded synthetic corpus, one path, or a mixture's."""
        return self.corpus if isinstance(self.corpus, tuple) else ((self.corpus,) if self.corpus else ())

    @property
    def is_mixture(self) -> bool:
        return isinstance(self.corpus, tuple)

    def __post_init__(self) -> None:
        if isinstance(self.corpus, (tuple, list)):
            corpora = tuple(str(c) for c in self.corpus)
            if any(not c.strip() for c in corpora):
                raise ConfigError(f"data.corpus={list(corpora)}: an empty path in a mixture (the embedded "
                                  "synthetic corpus cannot be mixed)")
            self.corpus = corpora[0] if len(corpora) == 1 else corpora
        if self.corpus_weights and (min(self.corpus_weights) < 0 or sum(self.corpus_weights) <= 0):
            raise ConfigError(f"data.corpus_weights={list(self.corpus_weights)}: weights must be >= 0, not all 0")
        if min(self.split_ratios) < 0 or abs(sum(self.split_ratios) - 1.0) > 1e-6:
            raise ConfigError(f"data.split_ratios={self.split_ratios} must be >= 0 and sum to 1")
        if self.shard_records < 1:
            raise ConfigError(f"data.shard_records={self.shard_records} must be >= 1")
        if self.shuffle_buffer < 0 or self.probe_max_windows < 2 or self.cache_in_memory_gb < 0 \
                or self.probe_labels_per_class < 0 or self.probe_subsets < 1:
            raise ConfigError("data.shuffle_buffer, data.cache_in_memory_gb and data.probe_labels_per_class "
                              "must be >= 0, data.probe_max_windows >= 2, data.probe_subsets >= 1")


@dataclass
class ModelConfig:
    """Encoder, decoders and projection heads (paper: Implementation Details)."""

    # Which encoder module: coreecg's own Encoder, or a published family's adapter (its name in
    # coreecg.model.published, e.g. st_mem), whose sizes below are read from its weights.
    arch: str = "coreecg"
    n_leads: int = 12
    input_samples: int = 2250
    patch_size: int = 75
    embed_dim: int = 256
    depth: int = 10
    num_heads: int = 4
    mlp_ratio: float = 4.0
    time_decoder_dim: int = 256
    time_decoder_depth: int = 10
    time_decoder_heads: int = 4
    latent_decoder_dim: int = 256
    latent_decoder_depth: int = 8
    latent_decoder_heads: int = 4
    proj_hidden_dim: int = 1024       # not in the paper: 2-layer MLP head, see docs/decisions.md
    proj_dim: int = 256
    dropout: float = 0.0
    # Decoder attention layout (the paper is silent): "joint" attends over all C * N tokens,
    # "lead" runs one sequence per lead with shared weights (ST-MEM's decoder). Measured in
    # docs/decisions.md.
    time_decoder_layout: Literal["joint", "lead", "axial"] = "axial"
    latent_decoder_layout: Literal["joint", "lead", "axial"] = "joint"

    @property
    def n_patches(self) -> int:
        return self.input_samples // self.patch_size


@dataclass
class MaskingConfig:
    """Which tokens the student sees.

    strategy: stdm (the paper), random (ST-MEM-style per-token masking at `ratio`),
    temporal (whole time columns at `ratio`, MTAE-like), lead (whole leads at `ratio`,
    MLAE-like). Only stdm drops tokens; the others split into visible and masked.
    """

    strategy: Literal["stdm", "random", "temporal", "lead"] = "stdm"
    p_time: float = 0.5
    p_lead: float = 0.2
    k: int = 4
    mode: Literal["bernoulli", "exact"] = "bernoulli"
    ratio: float = 0.75


@dataclass
class AugmentConfig:
    """Frequency Dynamic Augmentation of the teacher's view."""

    fda: bool = True                  # False: the teacher sees the raw view (ablation)
    learnable: bool = True            # False: W stays at its initial value
    eps: float = 1e-3
    init_std: float = 0.1             # W ~ N(0, init_std): breaks the A = 0.5 tie at step 0
    # W's starting map (paper: silent). random: N(0, init_std) alone, so the perturbed half of
    # each lead's bins is a random half, ECG band included; band: +1 inside the preprocessing
    # pass-band (data.preprocess.highpass_hz..lowpass_hz), -1 outside, plus the same noise:
    # the paper's premise that the 0.65-40 Hz band carries the ECG. See docs/decisions.md.
    init: Literal["random", "band"] = "band"


@dataclass
class LossConfig:
    alpha: float = 1.0                # reconstruction weight; 0 = contrastive-only ablation
    beta: float = 1.0                 # contrastive weight; 0 = reconstructive-only ablation
    tau: float = 0.2
    # Every contrastive method's negatives pool (one key, so compared methods share it): true,
    # the global batch (every rank's rows; the paper's batch of 256); false, each rank's own batch.
    gather_negatives: bool = True


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
    ema_momentum: float = 0.996       # teacher EMA at step 0 ...
    ema_momentum_end: float = 1.0     # ... cosine-increased to this at the last step (BYOL)


# The operations of finetune.augment (coreecg.augment.FINETUNE_OPS implements each one).
FINETUNE_AUGMENT_OPS = ("erase", "flip", "drop", "cutout", "shift", "sine", "square", "partial_sine",
                        "partial_noise", "noise")


@dataclass
class FinetuneConfig:
    """Downstream: encoder + a fresh linear head on mean-pooled tokens (paper: Training and
    Inference; 80 epochs, lr 8e-5, no warm-up, the rest as in pretraining: AdamW with weight
    decay 0.01, batch 256, cosine schedule; `optim.betas`, `optim.min_lr` and `optim.grad_clip`
    apply to both). docs/evaluation.md.

    mode: finetune (everything trains), linear (frozen encoder, linear head on mean-pooled
    tokens), frozen (frozen encoder, attention-pooling head: the benchmark's frozen setting,
    docs/benchmark.md), scratch (randomly initialised encoder, the paper's "Supervised" row; the
    architecture is `model`). encoder "random" in finetune/linear/frozen mode: the `model`
    architecture's seeded random weights (seed_for(train.seed, "random-encoder")), method label
    "Random init": the skeptic's rows (what pretraining adds over an untrained encoder).
    """

    mode: Literal["finetune", "linear", "frozen", "scratch"] = "finetune"
    # encoder.pt, a pretraining checkpoint, run or export folder; empty for scratch; "random": a
    # seeded, randomly initialised encoder of the `model` architecture (the "Random init" rows)
    encoder: str = ""
    leads: tuple[str, ...] = STANDARD_LEADS   # only these leads' tokens are fed (no zero-filling)
    train_fraction: float = 1.0       # stratified, seeded subset of the training split's patients
    lr: float = 8e-5
    warmup_epochs: float = 0.0
    epochs: int = 80
    batch_size: int = 256             # global, over train.num_workers
    weight_decay: float = 0.01
    eval_crops: int = 3               # evenly spaced crops per window; their logits are averaged
    # Linear probing (mode linear only; docs/evaluation.md "Linear probing"): probe_crops "eval"
    # trains the head on each window's mean pooled feature over its `eval_crops` evaluation crops
    # (the input it is scored on); "random" on a fresh random crop per epoch (the training crop
    # rule of the other modes). cache_features: the frozen encoder embeds each split once
    # (features/ in the run folder, reused on resume); false recomputes them every step and every
    # evaluation (the same numbers, slower; the reference the cache is tested against). With
    # probe_crops=random only the val/test features are cached.
    probe_crops: Literal["eval", "random"] = "eval"
    cache_features: bool = True
    eval_batch_size: int = 128
    bootstrap_resamples: int = 1000   # patient-level bootstrap of every test metric
    tsne_max_points: int = 2000
    # Names in the report tables: method "" = the encoder's train.variant, else its pretraining
    # method's label ("Supervised" for scratch); dataset "" = from the corpus manifest.
    method: str = ""
    dataset: str = ""
    # The leakage guard (docs/leakage.md): a fine-tuning whose encoder was pretrained on records or
    # patients of its val/test splits stops before training; true proceeds and records the overlap.
    allow_overlap: bool = False
    # Options the compared baselines fine-tune with (docs/evaluation.md "Fine-tuning options"); the
    # defaults are the paper's protocol. linear_lr: the lr of the head-only modes (linear, frozen):
    # a head alone on frozen features takes a far larger step than a whole network (lr).
    linear_lr: float = 1e-3
    # layer-wise lr decay (finetune/scratch): block i of D trains at lr * layer_decay^(D - i), the
    # embeddings at lr * layer_decay^(D + 1), the head (and the final norm) at lr; 1.0: off
    layer_decay: float = 1.0
    # the head's pooling: auto = the mode's (attention in frozen, mean otherwise); attention is
    # open to finetune/scratch too (linear with attention is mode frozen)
    head: Literal["auto", "mean", "attention"] = "auto"
    # a RandAugment-style policy on training crops (coreecg.augment.ecg_randaugment): per sample,
    # augment_num_ops ops drawn from these names, each applied with augment_prob at strength
    # augment_magnitude in [0, 1]; () = none (the paper). Never applied at evaluation.
    augment: tuple[str, ...] = ()
    augment_num_ops: int = 2
    augment_magnitude: float = 0.5
    augment_prob: float = 0.5

    def __post_init__(self) -> None:
        if not self.leads or len(set(self.leads)) != len(self.leads) or not set(self.leads) <= set(STANDARD_LEADS):
            unknown = [x for x in self.leads if x not in STANDARD_LEADS]
            raise ConfigError(f"finetune.leads={list(self.leads)} must be distinct names from {list(STANDARD_LEADS)}"
                              + (f"; unknown: {unknown}" if unknown else ""))
        if not 0.0 < self.train_fraction <= 1.0:
            raise ConfigError(f"finetune.train_fraction={self.train_fraction} must lie in (0, 1]")
        if self.epochs < 1 or self.batch_size < 1 or self.eval_crops < 1 or self.eval_batch_size < 1 \
                or self.bootstrap_resamples < 0 or self.tsne_max_points < 0:
            raise ConfigError("finetune.epochs, batch_size, eval_crops, eval_batch_size must be >= 1; "
                              "bootstrap_resamples and tsne_max_points >= 0")
        self._check_options()

    def _check_options(self) -> None:
        """The fine-tuning options: each one where it has a meaning, never silently ignored."""
        if not (self.lr > 0 and self.linear_lr > 0):
            raise ConfigError(f"finetune.lr={self.lr} and finetune.linear_lr={self.linear_lr} must be > 0")
        if not 0.0 < self.layer_decay <= 1.0:
            raise ConfigError(f"finetune.layer_decay={self.layer_decay} must lie in (0, 1] (1.0: off)")
        head_only = self.mode in ("linear", "frozen")
        if head_only and self.layer_decay != 1.0:
            raise ConfigError(f"finetune.layer_decay={self.layer_decay}: mode {self.mode} trains the head alone "
                              "(no encoder layers to decay); use mode finetune or scratch")
        if (self.mode, self.head) in (("linear", "attention"), ("frozen", "mean")):
            raise ConfigError(f"finetune.head={self.head} with mode {self.mode}: a frozen encoder with an "
                              "attention-pooling head is mode frozen, with a mean-pooled one mode linear")
        unknown = [x for x in self.augment if x not in FINETUNE_AUGMENT_OPS]
        if unknown or len(set(self.augment)) != len(self.augment):
            raise ConfigError(f"finetune.augment={list(self.augment)} must be distinct names from "
                              f"{list(FINETUNE_AUGMENT_OPS)}" + (f"; unknown: {unknown}" if unknown else ""))
        if self.augment_num_ops < 1 or not 0.0 <= self.augment_magnitude <= 1.0 \
                or not 0.0 <= self.augment_prob <= 1.0:
            raise ConfigError("finetune.augment_num_ops must be >= 1, augment_magnitude and augment_prob in [0, 1]")
        if self.augment and self.mode == "linear" and self.probe_crops == "eval":
            # the head trains on the evaluation crops' (cached) features: there is no training crop to augment
            raise ConfigError("finetune.augment with mode linear needs finetune.probe_crops=random (probe_crops=eval "
                              "trains on the fixed evaluation-crop features, cached or not)")

    @property
    def pooling(self) -> str:
        """The head's pooling: "mean" or "attention" (head, or the mode's when head is auto)."""
        if self.head != "auto":
            return self.head
        return "attention" if self.mode == "frozen" else "mean"

    @property
    def step_lr(self) -> float:
        """The lr the optimizer is scheduled from: linear_lr for the head-only modes, else lr."""
        return self.linear_lr if self.mode in ("linear", "frozen") else self.lr


@dataclass
class ReportConfig:
    """The report's tables (coreecg/eval/report.py, docs/evaluation.md).

    f1: which F1 the tables print. threshold: macro F1 at the paper's literal 0.5 threshold
        (metrics.json test.f1); argmax: macro F1 of argmax decisions, as ST-MEM's code computes
        it (test.f1_argmax), single-label only: a multi-label dataset keeps the threshold F1 and
        the table says so.
    reference: the method every other row is compared with (coreecg/eval/significance.py).
    bootstrap_resamples: test-patient resamples of those differences; 0 computes none.
    level: their interval's coverage; a difference is marked where its adjusted p < 1 - level.
    seed: the seed of their resampling (the same seed gives the same intervals).
    min_runs: runs each method needs in a cell for its difference to be tested and marked; below
        it the cell shows an interval from test-set sampling only (>= 2: a variance over runs).
    min_test_patients: test patients a cell needs to be marked.
    adjust: the correction over each table's testable differences: holm (family-wise error),
        bh (Benjamini-Hochberg, false discovery rate) or none.
    """

    f1: Literal["threshold", "argmax"] = "threshold"
    reference: str = "CoRe-ECG"
    bootstrap_resamples: int = 1000
    level: float = 0.95
    seed: int = 0
    min_runs: int = 3
    min_test_patients: int = 30
    adjust: Literal["holm", "bh", "none"] = "holm"

    def __post_init__(self) -> None:
        if not self.reference:
            raise ConfigError("report.reference must name a method (a table row)")
        if self.bootstrap_resamples < 0 or self.bootstrap_resamples == 1:
            raise ConfigError(f"report.bootstrap_resamples={self.bootstrap_resamples} must be 0 (none) or >= 2 "
                              "(a variance over resamples)")
        if not 0 < self.level < 1:
            raise ConfigError(f"report.level={self.level} must lie in (0, 1)")
        if self.min_runs < 2:
            raise ConfigError(f"report.min_runs={self.min_runs} must be >= 2 (the test needs a variance over runs)")
        if self.min_test_patients < 0:
            raise ConfigError(f"report.min_test_patients={self.min_test_patients} must be >= 0")


@dataclass
class TrainConfig:
    """Where and how a run trains. Ray Train: `num_workers` data-parallel workers (DDP),
    each with `cpus_per_worker` CPUs and one GPU when `use_gpu`; outputs go to
    `<storage_path>/<name>/`, and re-running with the same storage_path and name resumes."""

    seed: int = 0
    device: str = "auto"              # plain (no-Ray) loop and benchmarks only: auto | cpu | cuda
    precision: Literal["auto", "fp32", "bf16"] = "auto"   # auto: bf16 autocast on CUDA, fp32 on CPU
    log_every: int = 10               # steps between logged step metrics
    progress_every_s: float = 30.0    # a progress line within an epoch (step, samples/s, ETA); 0: none
    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: int = 1
    checkpoint_every_steps: int = 500  # 0: only at epoch ends
    keep_checkpoints: int = 3
    max_failures: int = 3             # worker-group restarts from the last checkpoint
    eval_every_epochs: int = 1        # probe + reconstruction figure; 0 disables
    figures: bool = True              # the reconstruction figure at eval epochs (1.5-2 s each at tiny
                                      # scale: sweeps turn it off, configs/sweep.yaml)
    # Speed and memory (coreecg/train/speed.py, docs/performance.md); none changes the numbers.
    host_memory_cache: bool = True    # CPU: keep freed activation memory instead of re-faulting it
    activation_checkpointing: bool = False   # recompute transformer blocks in backward: less memory
    compile: bool = False             # torch.compile each transformer block (inductor)
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
        if self.num_workers < 1 or self.cpus_per_worker < 1:
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


# ---------------------------------------------------------------------------- methods


@dataclass(frozen=True)
class MethodSpec:
    """What the config knows of a registered pretraining method; `coreecg.methods.register_method`
    declares it in the method's own module. The config, the checkpoint check and the loop read
    these fields and never name a method.

    options: the dataclass of its section `methods.<name>` (None: no section). Its
        `__post_init__` validates its own keys; an optional `check(self, config)` method
        cross-checks them against the rest of the config (called by `Config.validate` when the
        method trains).
    structural: the config keys that decide which modules a checkpoint of it holds and their
        shapes, in or outside its section: "a.b" (its value) or "a.b>0" (whether it is positive);
        `model.*` and `pretrain.method` are structural for every method.
    """

    name: str
    label: str                          # its name in tables
    options: type | None = None
    structural: tuple[str, ...] = ()
    cls: type | None = None             # the PretrainMethod subclass that builds it

    def structural_values(self, plain: dict[str, Any]) -> dict[str, Any]:
        """{key: value} of `structural` in a config's `to_dict()` ("a.b>0": whether a.b > 0)."""
        out = {}
        for entry in self.structural:
            key = entry.removesuffix(">0")
            value = plain
            for part in key.split("."):
                value = value[part]
            out[key] = value > 0 if entry.endswith(">0") else value
        return out


# The registry. The built-in methods register themselves when their package is imported, which
# `method_specs()` does on first use: the config reads `methods.<name>` of a built-in without the
# caller importing coreecg.methods, and names none of them here.
METHODS: dict[str, MethodSpec] = {}
BUILT_IN_PACKAGE = "coreecg.methods"
_built_ins_imported = False


def method_specs() -> dict[str, MethodSpec]:
    """Every registered method (the built-in ones' package imported on first use)."""
    global _built_ins_imported
    if not _built_ins_imported:
        _built_ins_imported = True
        importlib.import_module(BUILT_IN_PACKAGE)
    return METHODS


def register_method_spec(spec: MethodSpec) -> None:
    """Add a method to the registry (`coreecg.methods.register_method` calls this)."""
    name = spec.name
    if not name.isidentifier():
        raise ConfigError(f"method name {name!r} must be a Python identifier (it is a config key)")
    if spec.options is not None and not dataclasses.is_dataclass(spec.options):
        raise ConfigError(f"method {name!r}: options must be a dataclass, got {spec.options!r}")
    known = METHODS.get(name)
    if known is not None and known.cls is not None and known.cls is not spec.cls:
        raise ConfigError(f"method {name!r} is already registered by {known.cls.__module__}")
    METHODS[name] = spec                # first: its own section's keys resolve through the registry
    bad = [e for e in spec.structural if field_type(Config, e.removesuffix(">0")) is None]
    if bad:
        if known is None:
            del METHODS[name]
        else:
            METHODS[name] = known
        raise ConfigError(f"method {name!r}: structural key(s) {bad} are not config keys")


def import_plugins(modules: Iterable[str]) -> None:
    """Import the modules that register methods (`pretrain.plugins`), once each. Module names
    resolve as with `python -m`: from the current directory first, then the installed packages
    (a job script's own folder, which Python puts on the path instead, does not hold them)."""
    import os
    import sys

    modules = list(modules)
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"pretrain.plugins: cannot import {module!r}: {e}") from e


@dataclass
class PretrainConfig:
    """Which self-supervised method trains the encoder (coreecg/methods; docs/methods.md).

    method: a registered method (`core` is the paper's CoRe-ECG; docs/methods.md lists the others).
    plugins: modules imported before the method is looked up (on the driver and on every
    worker), each registering methods with `coreecg.methods.register_method`.
    """

    method: str = "core"
    plugins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        import_plugins(self.plugins)
        if self.method not in method_specs():
            raise ConfigError(f"pretrain.method={self.method!r} is not a registered method; known: "
                              f"{', '.join(sorted(METHODS))} (a plugin's module goes in pretrain.plugins)")


class MethodOptions(OpenSection):
    """The `methods` section: one typed options section per registered method that has one
    (`methods.<name>.<key>`). A section not set holds its dataclass's defaults."""

    unknown_reason = "no registered method with options of that name; a plugin's module goes in pretrain.plugins"

    @classmethod
    def section_type(cls, name: str) -> type | None:
        spec = method_specs().get(name)
        return spec.options if spec is not None else None

    @classmethod
    def known(cls) -> list[str]:
        return sorted(n for n, s in method_specs().items() if s.options is not None)

    def names(self, selected: str | None = None) -> list[str]:
        """The sections a saved config holds: the built-in methods', those set explicitly and the
        selected method's, never a section only because some plugin was imported in this
        process (a config must reload where that plugin is not)."""
        specs = method_specs()
        built_in = [n for n, s in specs.items() if getattr(s.cls, "__module__", "").startswith(BUILT_IN_PACKAGE + ".")]
        keep = [*built_in, *self._sections, *([selected] if selected else [])]
        return [n for n in dict.fromkeys(keep) if n in specs and specs[n].options is not None]


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)     # before methods: plugins add sections
    methods: MethodOptions = field(default_factory=MethodOptions)
    report: ReportConfig = field(default_factory=ReportConfig)

    @property
    def method(self) -> MethodSpec:
        """The registry entry of the method that trains (`pretrain.method`)."""
        return method_specs()[self.pretrain.method]

    @property
    def method_label(self) -> str:
        """The name downstream tables list this run's encoder under."""
        return self.train.variant or self.method.label

    @property
    def method_options(self) -> Any:
        """The selected method's options section (None for a method without one)."""
        return getattr(self.methods, self.pretrain.method) if self.method.options is not None else None

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        out["methods"] = {n: to_plain(getattr(self.methods, n)) for n in self.methods.names(self.pretrain.method)}
        return out

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        return text

    def validate(self) -> "Config":
        """Checks across sections (each section checks its own keys when built), then the
        training method's own cross-checks (`check(config)` of its options, if it has one)."""
        m, k = self.model, self.masking
        # model.arch names a family of coreecg.model.published, checked where an encoder is built
        # from the config (the config layer does not import the model layer)
        if not re.fullmatch(r"[a-z][a-z0-9_]*", m.arch):
            raise ConfigError(f"model.arch={m.arch!r} is not an encoder family name (coreecg, st_mem, ...)")
        if m.input_samples % m.patch_size:
            raise ConfigError(f"model.input_samples={m.input_samples} is not a multiple of model.patch_size={m.patch_size}")
        for name in ("embed_dim", "time_decoder_dim", "latent_decoder_dim"):
            heads = getattr(m, name.replace("dim", "heads") if name != "embed_dim" else "num_heads")
            if getattr(m, name) % heads:
                raise ConfigError(f"model.{name}={getattr(m, name)} is not divisible by its head count {heads}")
        for which in ("time", "latent"):
            if getattr(m, f"{which}_decoder_layout") == "axial" and getattr(m, f"{which}_decoder_depth") < 2:
                raise ConfigError(f"model.{which}_decoder_layout=axial alternates within-lead and within-column "
                                  f"blocks: it needs model.{which}_decoder_depth >= 2")
        for name in ("p_time", "p_lead", "ratio"):
            if not 0.0 <= getattr(k, name) <= 1.0:
                raise ConfigError(f"masking.{name}={getattr(k, name)} must lie in [0, 1]")
        if k.strategy == "stdm" and not 0 < k.k < m.n_leads:
            raise ConfigError(f"masking.k={k.k} must satisfy 0 < k < model.n_leads={m.n_leads}")
        if self.loss.alpha < 0 or self.loss.beta < 0 or self.loss.alpha + self.loss.beta == 0:
            raise ConfigError("loss.alpha and loss.beta must be >= 0 and not both 0")
        if self.loss.tau <= 0:
            raise ConfigError(f"loss.tau={self.loss.tau} must be > 0")
        if self.data.crop_samples != m.input_samples:
            raise ConfigError(f"data.crop_samples={self.data.crop_samples} must equal model.input_samples={m.input_samples}")
        if self.data.crop_samples > self.data.preprocess.window_samples:
            raise ConfigError("data.crop_samples exceeds the stored window length")
        d = self.data
        if d.corpus_weights and len(d.corpus_weights) != len(d.corpora):
            raise ConfigError(f"data.corpus_weights={list(d.corpus_weights)}: one weight per corpus of data.corpus "
                              f"({len(d.corpora)})")
        pre = self.data.preprocess
        if pre.min_duration_s * pre.sampling_rate < m.patch_size:
            raise ConfigError(f"data.preprocess.min_duration_s={pre.min_duration_s} keeps records shorter than "
                              f"one patch (model.patch_size={m.patch_size} samples at {pre.sampling_rate} Hz)")
        for what, batch in (("finetune", self.finetune.batch_size), ("optim", self.optim.batch_size)):
            if batch % self.train.num_workers:
                raise ConfigError(f"{what}.batch_size={batch} (the global batch) is not divisible "
                                  f"by train.num_workers={self.train.num_workers}")
        check = getattr(self.method_options, "check", None)
        if callable(check):
            check(self)
        return self


# ---------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `a.b=c` overrides. Plugins named in
    the overrides are imported first, so the file may set their `methods.<name>` sections."""
    overrides = list(overrides)
    _import_plugins_of(overrides)
    cfg = Config()
    if path is not None:
        cfg = load(cfg, read_yaml(path, ConfigError), origin=str(path), error=ConfigError)
    return apply_overrides(cfg, overrides).validate()


def apply_overrides(cfg: Config, overrides: Iterable[str], origin: str = "overrides",
                    error: type[TypedError] = ConfigError) -> Config:
    """`cfg` with each `a.b=c` applied in order (not validated across sections: `validate()`);
    `error` "<origin>: <key>: <reason>" for an unknown key or a wrong value."""
    overrides = list(overrides)
    _import_plugins_of(overrides)
    for item in overrides:
        cfg = load(cfg, override(Config, item, error, origin), origin=origin, error=error)
    return cfg


def _import_plugins_of(overrides: list[str]) -> None:
    for item in overrides:
        key, _, raw = item.partition("=")
        if key.strip() == "pretrain.plugins":
            try:
                plugins = yaml.safe_load(raw)
            except yaml.YAMLError:
                continue                      # the override itself reports it
            if isinstance(plugins, list):
                import_plugins(str(p) for p in plugins)


def config_from_dict(data: dict[str, Any], origin: str = "config") -> Config:
    """Rebuild a config saved with `to_dict` (checkpoints, run folders)."""
    ft = data.get("finetune")
    if isinstance(ft, dict) and ft.get("mode") == "full":   # coreecg <= 0.1.0 called finetune "full"
        data = {**data, "finetune": {**ft, "mode": "finetune"}}
    return load(Config, data, origin=origin, error=ConfigError).validate()
