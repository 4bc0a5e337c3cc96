"""The downstream sections: fine-tuning (`finetune`) and the report's tables (`report`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coreecg.config.base import STANDARD_LEADS, ConfigError


# The operations of finetune.augment (coreecg.train.augment.FINETUNE_OPS implements each one).
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
    # The corpus's task (coreecg.data.tasks), recorded by the planner: "" = its statements (a label task);
    # a regression or binary task's name (age, sex, column:<name>). A run's config says what its head predicts.
    task: str = ""
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
    # a RandAugment-style policy on training crops (coreecg.train.augment.ecg_randaugment): per sample,
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
    adjust: the correction within each family of a table's testable differences: holm
        (family-wise error), bh (Benjamini-Hochberg, false discovery rate) or none.
    primary_metric: the metric a table's claims are about (acc, f1 or auroc): its differences are one
        family; each secondary metric's differences are a family of their own, and say so.
    equivalence_margin: in percentage points of the primary metric: a difference not marked is
        "equivalent within +-margin" only where two one-sided tests show it (TOST at 1 - level,
        corrected like the family); otherwise it is "inconclusive", with the smallest difference
        the cell could detect.
    power: the power at which that smallest detectable difference is stated (above 1 - level).
    min_positive_patients: a class with fewer positive test patients is left out of the tables'
        macro F1 and AUROC and of the differences' resamples (named in the table's legend; a
        run's metrics.json keeps every class and records each class's positive patients): its
        AUROC interval would be far too narrow (docs/evaluation.md, "Rare classes").
    """

    f1: Literal["threshold", "argmax"] = "threshold"
    reference: str = "CoRe-ECG"
    bootstrap_resamples: int = 1000
    level: float = 0.95
    seed: int = 0
    min_runs: int = 3
    min_test_patients: int = 30
    adjust: Literal["holm", "bh", "none"] = "holm"
    primary_metric: Literal["acc", "f1", "auroc"] = "auroc"
    equivalence_margin: float = 2.0
    power: float = 0.8
    min_positive_patients: int = 5
    # jobs/report.py writes these registered tables (a plugin's too) instead of its default ones;
    # empty: the defaults (--tables sets it)
    tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.equivalence_margin <= 0:
            raise ConfigError(f"report.equivalence_margin={self.equivalence_margin} must be > 0 (percentage points)")
        if not 1 - self.level < self.power < 1:
            raise ConfigError(f"report.power={self.power} must lie in (1 - report.level, 1) = ({1 - self.level:g}, 1): "
                              "a test passes its own level with that probability at a true difference of 0")
        if self.min_positive_patients < 1:
            raise ConfigError(f"report.min_positive_patients={self.min_positive_patients} must be >= 1")
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
