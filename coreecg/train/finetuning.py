"""Downstream fine-tuning, linear probing and the supervised-from-scratch baseline: the task for
the shared loop (`coreecg.train.loop.train_worker`) and its planner (`plan_finetune`, no Ray).
Run one with `coreecg.train.fit`:

    from coreecg.train.fit import fit, plan_run
    result = fit(plan_run(load_config(overrides=["data.corpus=corpora/ptbxl",
                                             "finetune.encoder=runs/pretrain/encoder.pt"]), "finetune"))

The task is the corpus's own (manifest: class names, single- or multi-label). Model selection:
the epoch with the best validation macro AUROC (its weights saved as best.pt); the test split is
scored once, after training, with those weights. Outputs in `train.run_dir`: config.yaml,
metrics.jsonl, tensorboard/, checkpoint_step*/ (resume), best.pt, metrics.json (contract in
coreecg.eval.report), predictions.csv, train_subset.csv, figures/tsne.png. docs/evaluation.md.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coreecg.augment import ecg_randaugment
from coreecg.checkpoints import BEST_FILE, CheckpointError, load_checkpoint, save_checkpoint
from coreecg.config import Config, FinetuneConfig, ModelConfig, PreprocessConfig
from coreecg.data.corpus import load_manifest, unpadded_split
from coreecg.data.leads import LEAD_SETS, LeadSetError, parse_lead_set
from coreecg.data.reading import META_COLUMNS, read_split
from coreecg.files import write_json
from coreecg.loading import load_encoder, open_source
from coreecg.train.ingest import to_model_input
from coreecg.train.leakage import Pretraining, check_overlap, pretraining_of
from coreecg.train.loop import RunWriter, WorkerContext
from coreecg.train.plan import FinetuneSpec, RunPlan, preflight, steps_per_epoch
from coreecg.train.step import FinetuneStep, Schedule

log = logging.getLogger(__name__)

# What makes a run folder one fine-tuning: another value of these is another run (refused).
SAME_RUN = ("data.corpus", "finetune.encoder", "finetune.mode", "finetune.leads", "finetune.train_fraction",
            "finetune.probe_crops", "train.seed", "finetune.head", "finetune.layer_decay")


# finetune.encoder=random: a seeded, randomly initialised encoder of the `model` section's
# architecture (the "Random init" rows: what pretraining adds over an untrained network).
RANDOM_ENCODER = "random"
RANDOM_LABEL = "Random init"


def random_encoder(config: Config):
    """The encoder `finetune.encoder=random` trains on: `build_encoder(config.model)` initialised
    from its own generator, seeded by (train.seed, "random-encoder"). The global torch RNG is
    forked, so the draws of everything else (the head, dropout, crops) are those of a run with
    a loaded encoder: the same train.seed gives the same weights, another seed other weights."""
    from coreecg.model.published import build_encoder
    from coreecg.train.ingest import seed_for

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for(config.train.seed, "random-encoder"))
        return build_encoder(config.model)


class FinetuneError(ValueError):
    """Input that cannot be fine-tuned on (named, before any training)."""


def parse_leads(text: str) -> tuple[str, ...]:
    """--leads: 12 | 6 (I, II, III, aVR, aVL, aVF) | 1 (I) | a comma list of lead names
    (`coreecg.data.leads.parse_lead_set`, its error as a FinetuneError)."""
    try:
        return parse_lead_set(text)
    except LeadSetError as e:
        raise FinetuneError(f"--leads: {e}") from None


def leads_label(leads: tuple[str, ...]) -> str:
    """"12" / "6" / "1" for the paper's lead sets, else the names joined by commas."""
    for label, names in LEAD_SETS.items():
        if tuple(leads) == names:
            return label
    return ",".join(leads)


def config_hash(config: Config) -> str:
    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def dataset_name(manifest: dict) -> str:
    """The report's dataset key from a corpus manifest (cinc2021 restricted to Ningbo -> ningbo).

    PTB-XL with another task or the fold split is a benchmark of its own, so that its runs never
    share a table cell with the paper's task: ptbxl-rhythm, ptbxl-folds, ptbxl-form-folds.
    """
    source = manifest["source"]
    options = manifest.get("source_options") or {}
    subsets = options.get("subsets") or []
    if source == "cinc2021" and len(subsets) == 1:
        return str(subsets[0]).lower()
    if source == "ptbxl":
        task, split = options.get("task", "superdiagnostic"), manifest.get("split_rule", "patients")
        parts = [source] + [task] * (task != "superdiagnostic") + [split] * (split == "folds")
        return "-".join(parts)
    return source


# ---------------------------------------------------------------------------- the task


class FinetuneTask:
    """The fine-tuning of a plan (`plan_finetune`) on one worker's device."""

    name = "finetune"

    def __init__(self, plan: RunPlan, device: torch.device):
        spec = plan.finetune
        self.config, self.spec, self.corpus, self.device = plan.config, spec, plan.corpus, device
        f = self.config.finetune
        self.epochs, self.global_batch = f.epochs, f.batch_size
        self.class_names, self.multilabel = list(spec.class_names), spec.multilabel
        self.lead_rows = list(spec.lead_rows)
        self._rows = (None if self.lead_rows == list(range(spec.stored_leads))
                      else torch.tensor(self.lead_rows, device=device))
        # Targets by uid: the train split's labels are tiny next to its signals.
        self.targets = torch.from_numpy(read_split(self.corpus, "train", ["labels"])["multihot"]).to(device)
        self._splits: dict[str, Any] = {}
        # Linear probing (docs/evaluation.md "Linear probing"): with probe_crops=eval the head
        # trains on each window's mean pooled feature over its evaluation crops; cached, those
        # features (and val/test's) are computed once per encoder and corpus (coreecg.train.features).
        self.linear = f.mode == "linear"
        self.eval_crop_probe = self.linear and f.probe_crops == "eval"
        self.cached = self.linear and f.cache_features
        self._features: dict[str, torch.Tensor] = {}     # split -> (n, D) on the device (train: by uid)
        self.feature_info: dict[str, Any] | None = None
        self._core = None

    def build(self, ctx: WorkerContext):
        from coreecg.model.classifier import Classifier
        from coreecg.model.published import build_encoder

        cfg, f = self.config, self.config.finetune
        # Loading (and the random encoder's own generator) draws no random numbers (coreecg.loading): the head below is initialised
        # alike whichever source (run folder, encoder.pt, export) holds the encoder's weights.
        if self.spec.encoder == RANDOM_ENCODER:
            encoder = random_encoder(cfg)
        else:
            encoder = load_encoder(self.spec.encoder) if self.spec.encoder else build_encoder(cfg.model)
        model = Classifier.for_mode(encoder, len(self.class_names), f.leads, self.multilabel, f.mode,
                                    f.head).to(ctx.device)
        self._core = model
        if self.cached:          # draws no random numbers: the encoder is frozen, in eval mode
            self._cache_features(model, ctx)
        schedule = Schedule(ctx.steps_per_epoch, f.epochs, f.warmup_epochs)
        step = FinetuneStep(ctx.wrap(model), cfg, schedule, core=model)
        step.unpadded = unpadded_split(self.corpus, "train")     # no key-padding mask when none is needed
        return model, step

    def _cache_features(self, model, ctx: WorkerContext) -> None:
        """The frozen encoder's features of val, test (and, with probe_crops=eval, train) under
        the crop rule: reused from the run folder when they are this encoder's and corpus's,
        else computed once (rank 0 saves them)."""
        from coreecg.eval.downstream import eval_offsets, load_split, predict
        from coreecg.train.features import feature_key, load_or_compute, weights_sha256

        cfg, f = self.config, self.config.finetune
        crop, precision = cfg.data.crop_samples, cfg.train.precision
        key = feature_key(encoder=f.encoder, encoder_sha256=weights_sha256(model.encoder), corpus=self.corpus,
                          leads=list(f.leads), crop=crop, offsets=eval_offsets(self.spec.stored_samples, crop,
                                                                               f.eval_crops),
                          precision=precision)

        def embed(split: str):
            def run() -> tuple[np.ndarray, np.ndarray]:
                data = self._split(split) if split != "train" else load_split(self.corpus, "train")
                _, feats = predict(model, data.signal, self.lead_rows, crop, f.eval_crops, self.device,
                                   f.eval_batch_size, precision)
                return data.uid, feats
            return run

        splits = ("val", "test", *(("train",) if self.eval_crop_probe else ()))
        out, self.feature_info = load_or_compute(ctx.run_dir, key, {s: embed(s) for s in splits}, write=ctx.is_main)
        for split in ("val", "test"):
            uid, feats = out[split]
            if not np.array_equal(uid, self._split(split).uid):
                raise FinetuneError(f"{ctx.run_dir}: cached {split} features are not of the split's windows")
            self._features[split] = torch.from_numpy(feats).to(self.device)
        if self.eval_crop_probe:
            uid, feats = out["train"]
            table = torch.zeros(len(self.targets), feats.shape[1], device=self.device)   # unlabelled rows: unused
            table[torch.from_numpy(uid).to(self.device)] = torch.from_numpy(feats).to(self.device)
            self._features["train"] = table

    def inputs(self, signal: torch.Tensor, uid: torch.Tensor, epoch: int, generator: torch.Generator):
        if self.eval_crop_probe:
            # the head's input is the pooled feature it is scored on: the evaluation crops' mean
            feats = self._features["train"][uid] if self.cached else self._window_features(signal)
            return (feats, self.targets[uid]), {"pooled": True}
        if self._rows is not None:
            signal = signal[:, self._rows]                 # only the asked leads' tokens are fed
        x = to_model_input(signal, uid, self.config.train.seed, epoch, self.config.data.crop_samples)
        f = self.config.finetune
        if f.augment:      # training crops only: evaluation (predict) never augments
            x = ecg_randaugment(x, f.augment, f.augment_num_ops, f.augment_magnitude, f.augment_prob, generator,
                                fs=self.config.data.preprocess.sampling_rate)
        return (x, self.targets[uid]), {}

    @torch.no_grad()
    def _window_features(self, signal: torch.Tensor) -> torch.Tensor:
        """Uncached probe_crops=eval: the batch's evaluation-crop features, computed as `predict`
        computes them (the reference the cached features are tested against)."""
        from coreecg.eval.downstream import crop_features, eval_offsets

        cfg, f = self.config, self.config.finetune
        if self._rows is not None:
            signal = signal[:, self._rows]
        offsets = eval_offsets(signal.shape[-1], cfg.data.crop_samples, f.eval_crops)
        return crop_features(self._core, signal, offsets, cfg.data.crop_samples, cfg.train.precision)[0]

    def start(self, core, ctx: WorkerContext, writer: RunWriter) -> dict[str, Any]:
        return {}

    def should_evaluate(self, number: int) -> bool:
        every = self.config.train.eval_every_epochs or self.epochs   # selection needs at least one
        return number % every == 0 or number == self.epochs

    def _split(self, name: str):
        from coreecg.eval.downstream import load_split

        if name not in self._splits:
            self._splits[name] = load_split(self.corpus, name)
        return self._splits[name]

    def _records(self, core, split: str):
        from coreecg.eval.downstream import predict, to_records

        f, data = self.config.finetune, self._split(split)
        if split in self._features:          # a linear probe's cached features: the head alone
            from coreecg.eval.downstream import predict_features

            feats = self._features[split]
            return to_records(data, predict_features(core, feats), feats.cpu().numpy())
        probs, feats = predict(core, data.signal, self.lead_rows, self.config.data.crop_samples, f.eval_crops,
                               self.device, f.eval_batch_size, self.config.train.precision)
        return to_records(data, probs, feats)

    def evaluate(self, core, ctx: WorkerContext, writer: RunWriter, epoch: int, step: int,
                 state: dict[str, Any]) -> dict[str, float]:
        """Validation metrics; on a new best macro AUROC (or at the first evaluation), best.pt."""
        from coreecg.eval.downstream import score

        t0 = time.perf_counter()
        m = score(self._records(core, "val"), self.multilabel, self.class_names)
        nan = float("nan")
        out = {"val_auroc": m["auroc"] if m["auroc"] is not None else nan, "val_acc": m["acc"],
               "val_f1": m["f1"] if m["f1"] is not None else nan}
        best = state.get("best_val_auroc")
        improved = best is None or (not math.isnan(out["val_auroc"])
                                    and (math.isnan(best) or out["val_auroc"] > best))
        if improved:
            # self-contained: what the classifier predicts travels with its weights (coreecg.loading)
            save_checkpoint(ctx.run_dir / BEST_FILE, core.state_dict(), self.config, task=self.name, epoch=epoch,
                            step=step, val=out, class_names=list(self.class_names), multilabel=self.multilabel,
                            leads=list(self.config.finetune.leads))
            state.update(best_val_auroc=out["val_auroc"], best_epoch=epoch, best_step=step)
        out["val_seconds"] = time.perf_counter() - t0
        return out

    def finish(self, core, ctx: WorkerContext, writer: RunWriter, summary: dict[str, float],
               state: dict[str, Any]) -> None:
        """Test metrics, once, with the selected weights; metrics.json, predictions.csv, t-SNE."""
        from coreecg.eval.downstream import crop_rule, score, write_predictions
        from coreecg.eval.figures import tsne_figure

        cfg, f = self.config, self.config.finetune
        payload, _ = load_checkpoint(ctx.run_dir / BEST_FILE, self.device)
        core.load_state_dict(payload["model"])
        seed, n_boot = cfg.train.seed, f.bootstrap_resamples
        val, test = self._records(core, "val"), self._records(core, "test")
        metrics = {
            **self.spec.meta,
            "selection": {"metric": "validation macro AUROC (one-vs-rest)", "best_epoch": int(payload["epoch"]),
                          "best_step": int(payload["step"]), "val_auroc": payload["val"]["val_auroc"],
                          "epochs": self.epochs, "steps": int(summary.get("step", 0))},
            "test": score(test, self.multilabel, self.class_names, n_boot, seed),
            "val": score(val, self.multilabel, self.class_names, n_boot, seed),
            "crop_rule": crop_rule(self.spec.stored_samples, cfg.data.crop_samples, f.eval_crops),
            "aggregation": "record = mean of its windows' probabilities; CIs resample patients",
            "bootstrap_resamples": n_boot,
            "unlabelled_windows_skipped": {s: int(self._split(s).unlabelled) for s in ("val", "test")},
        }
        if self.linear:
            metrics["probe"] = {
                "crops": f.probe_crops,
                "training_rule": ("the head trains on each window's mean pooled feature over its evaluation crops "
                                  "(the input it is scored on)" if self.eval_crop_probe else
                                  "the head trains on a random crop of each window, fresh every epoch"),
                "cached_features": self.cached,
                **({"features_reused": self.feature_info["reused"],
                    "features_seconds": round(self.feature_info["seconds"], 3),
                    "features_key_hash": self.feature_info["key_hash"]} if self.feature_info else {})}
        metrics["counts"]["val_windows"] = int(len(self._split("val").record_id))
        metrics["counts"]["test_windows"] = int(len(self._split("test").record_id))
        write_json(ctx.run_dir / "metrics.json", _json_ready(metrics))
        write_predictions(ctx.run_dir / "predictions.csv", test, self.class_names)
        if f.tsne_max_points and len(test.record_id) >= 5:
            fig = tsne_figure(test.features, test.y, self.class_names, self.multilabel, seed=seed,
                              max_points=f.tsne_max_points,
                              title=f"{metrics['method']} ({f.mode}) on {metrics['dataset']} test records")
            writer.figure(fig, "tsne", int(payload["epoch"]), int(payload["step"]))
            (ctx.run_dir / "figures" / f"tsne_epoch{int(payload['epoch'])}.png").replace(
                ctx.run_dir / "figures" / "tsne.png")
        writer.line({"event": "test", **{k: metrics["test"][k] for k in ("acc", "f1", "auroc")}})
        writer.scalars("test", {k: metrics["test"][k] for k in ("acc", "f1", "auroc")
                                if metrics["test"][k] is not None}, int(summary.get("step", 0)))


def _json_ready(obj: Any) -> Any:
    """NaN -> None (JSON has no NaN), numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return None if math.isnan(obj) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


# ---------------------------------------------------------------------------- the plan


def plan_finetune(config: Config) -> RunPlan:
    """Every check that can fail before training, and the run's fixed facts, as a RunPlan.

    FinetuneError / CheckpointError / SubsetError (ValueErrors naming the file or key) for: a
    corpus without labels or without labelled val/test windows, a lead it does not store, an
    encoder checkpoint that is unreadable, holds no encoder, or has another shape than asked,
    a scratch run given an encoder (or a fine-tune given none), a fraction that empties a class,
    a run folder that holds another run; LeakageError when the encoder's pretraining corpus shares
    records or patients with the val/test splits (unless finetune.allow_overlap; docs/leakage.md).
    """
    from coreecg.data.locate import training_corpus
    from coreecg.data.subsets import subset_summary

    corpus = training_corpus(config)
    manifest = load_manifest(corpus)
    names = list(manifest["class_names"])
    if not names:
        raise FinetuneError(f"{corpus}: the corpus has no labels (class_names is empty); fine-tuning needs a "
                            "labelled corpus (build it with a label view)")
    stored = list(manifest["signal"]["leads"])
    missing = [x for x in config.finetune.leads if x not in stored]
    if missing:
        raise FinetuneError(f"{corpus}: finetune.leads {missing} are not stored in this corpus (it has {stored})")
    config, encoder_hash, method, pretraining, contract = _with_encoder(config)
    f = config.finetune
    if f.mode in ("linear", "frozen") and f.lr != FinetuneConfig.lr:
        # a head-only mode trains at linear_lr; an lr set for it is almost always meant for it
        log.warning("finetune.lr=%g is not used in mode %s: the head-only modes train at finetune.linear_lr=%g "
                    "(set that instead)", f.lr, f.mode, f.linear_lr)
    mismatch = preprocess_mismatch(contract, manifest, corpus)
    leakage, overlap = _leakage_check(pretraining, corpus, f.allow_overlap,
                                      *(("randomly initialised encoder: no pretraining",)
                                        if f.encoder == RANDOM_ENCODER else ()))
    stored_samples = int(manifest["signal"]["shape"][-1])
    if config.data.crop_samples > stored_samples:
        raise FinetuneError(f"{corpus}: windows of {stored_samples} samples are shorter than the model's input "
                            f"({config.data.crop_samples})")

    train, labelled, keep = _train_subset(corpus, config, names)
    counts = train["multihot"][keep].sum(axis=0)
    meta = {
        "method": method, "dataset": f.dataset or dataset_name(manifest), "mode": f.mode,
        "leads": leads_label(f.leads), "lead_names": list(f.leads), "train_fraction": f.train_fraction,
        "seed": config.train.seed, "multilabel": bool(manifest["multilabel"]), "class_names": names,
        # which split rule made val/test (corpora before the rule was recorded: the patient hash)
        "split_rule": manifest.get("split_rule", "patients"),
        "corpus": str(corpus), "encoder": f.encoder or None, "encoder_config_hash": encoder_hash,
        "config_hash": config_hash(config), "leakage": leakage,
        "classes_absent_from_train": [c for c, n in zip(names, counts) if n == 0],
        "train_subset": subset_summary(train["patient_id"][labelled], train["multihot"][labelled],
                                       keep[labelled], names),
        "counts": {"train_windows": int(keep.sum()), "train_unlabelled_windows_skipped": int((~labelled).sum())},
    }
    if mismatch:
        meta["preprocess_mismatch"] = mismatch
    spec = FinetuneSpec(encoder=f.encoder, lead_rows=tuple(stored.index(x) for x in f.leads),
                        stored_leads=len(stored), stored_samples=stored_samples, class_names=tuple(names),
                        multilabel=bool(manifest["multilabel"]), meta=meta,
                        kept_patients=tuple(sorted(set(train["patient_id"][keep]))),
                        overlap_csv=overlap.pairs.to_csv(index=False) if overlap is not None else "")
    n = int(keep.sum())
    spe = steps_per_epoch(corpus, n, f.batch_size, config.train.num_workers, "finetune.batch_size")
    run_dir = config.train.run_dir
    notes = preflight(run_dir, config, same_run=SAME_RUN)
    finished = not notes and (run_dir / "config.yaml").is_file() and (run_dir / "metrics.json").is_file()
    return RunPlan("finetune", config, corpus, n, spe, finetune=spec, resume_notes=tuple(notes), keep=keep,
                   finished=finished)


def _leakage_check(pretraining: Pretraining | None, corpus: Path, allow: bool,
                   reason: str = "trained from scratch: no encoder"):
    """The leakage guard (coreecg.train.leakage): metrics.json's "leakage" entry and the overlap;
    a supervised run has no pretraining corpus, so nothing to compare."""
    if pretraining is None:
        return {"checked": False, "allowed": allow, "overlap": False, "reason": reason}, None
    return check_overlap(pretraining, corpus, allow)


# The preprocessing settings that change what an encoder sees (the window length and lead set do not).
CONTRACT_KEYS = ("sampling_rate", "highpass_hz", "lowpass_hz", "filter_order", "standardize")


def preprocess_mismatch(encoder: PreprocessConfig | None, manifest: dict, corpus: Path) -> list[str]:
    """How the fine-tuning corpus's preprocessing (its manifest) differs from the encoder's input
    contract (its pretraining corpus's settings, or a published family's), as "key: encoder X,
    corpus Y" lines; empty when they agree or either is unknown. A sampling rate that differs is
    a FinetuneError (patches are counted in samples: another rate is another time scale); the
    rest is a warning (plan lines, metrics.json "preprocess_mismatch"): fine-tuning adapts to a
    filter or a normalisation, and comparing them is a legitimate experiment."""
    saved = manifest.get("preprocess")
    if encoder is None or not isinstance(saved, dict):
        return []
    corpus_pre = {**{k: getattr(PreprocessConfig(), k) for k in CONTRACT_KEYS}, **saved}
    diff = [f"{k}: encoder {getattr(encoder, k)}, corpus {corpus_pre[k]}" for k in CONTRACT_KEYS
            if getattr(encoder, k) != corpus_pre[k]]
    if encoder.sampling_rate != corpus_pre["sampling_rate"]:
        raise FinetuneError(f"{corpus}: windows at {corpus_pre['sampling_rate']} Hz, but the encoder takes "
                            f"{encoder.sampling_rate} Hz; rebuild the corpus with data.preprocess.sampling_rate="
                            f"{encoder.sampling_rate}")
    return diff


def _with_encoder(config: Config) -> tuple[Config, str | None, str, Pretraining | None, PreprocessConfig | None]:
    """-> (config, the encoder's config hash, the method's table name, its pretraining data). A
    fine-tune or linear probe takes its architecture (model, crop) from the encoder, whose path is
    resolved; a scratch run keeps the config (no hash, "Supervised" unless finetune.method says
    otherwise, no pretraining)."""
    f = config.finetune
    if config.model.arch != "coreecg":     # a family name the registry knows (the config cannot check it)
        from coreecg.model.published import family

        try:
            family(config.model.arch)
        except KeyError as e:
            raise FinetuneError(str(e).strip("'\"")) from None
    if f.mode == "scratch":
        if f.encoder:
            raise FinetuneError(f"finetune.mode=scratch trains a randomly initialised encoder; drop the encoder "
                                f"({f.encoder}) or use mode finetune/linear")
        return config, None, f.method or "Supervised", None, None
    if not f.encoder:
        raise FinetuneError(f"finetune.mode={f.mode} needs an encoder checkpoint (--encoder PATH, or random); "
                            "use --mode scratch for the supervised baseline")
    if f.encoder == RANDOM_ENCODER:
        # the config's architecture, untrained: no encoder hash, no pretraining, no input contract
        return config, None, f.method or RANDOM_LABEL, None, None
    path = Path(f.encoder).expanduser().resolve()
    # encoder.pt, a checkpoint, a run folder or an export folder: read and verified here
    # (CheckpointError naming the file otherwise); the model is built once, by the task
    src = open_source(path, kind="encoder")
    saved = src.config
    # a published encoder's architecture is its released weights': the config's model section
    # (e.g. a study's, meant for its pretrainings) gives way to it
    if not src.entries.get("published") and config.model != ModelConfig() and config.model != saved.model:
        diff = [f"model.{k.name}: {getattr(saved.model, k.name)} in the checkpoint, {getattr(config.model, k.name)} "
                "asked" for k in dataclasses.fields(ModelConfig)
                if getattr(saved.model, k.name) != getattr(config.model, k.name)]
        raise CheckpointError(f"{path}: an encoder of another shape than the config asks for ({'; '.join(diff[:4])})")
    config = dataclasses.replace(
        config, model=saved.model, data=dataclasses.replace(config.data, crop_samples=saved.model.input_samples),
        finetune=dataclasses.replace(f, encoder=str(path))).validate()
    return (config, config_hash(saved), config.finetune.method or saved.method_label, pretraining_of(src),
            saved.data.preprocess)


def _train_subset(corpus: Path, config: Config, names: list[str]) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """-> (the train split's metadata columns, labelled (N,) bool, keep (N,) bool: the labelled
    windows of the finetune.train_fraction patient subset). FinetuneError when train, val or
    test holds no labelled window; SubsetError when the fraction empties a class."""
    from coreecg.data.subsets import stratified_patient_subset

    train = read_split(corpus, "train", META_COLUMNS)
    labelled = train["multihot"].any(axis=1)
    if not labelled.any():
        raise FinetuneError(f"{corpus}: no labelled windows in the train split")
    for split in ("val", "test"):
        if not read_split(corpus, split, ["labels"])["multihot"].any(axis=1).any():
            raise FinetuneError(f"{corpus}: no labelled windows in the {split} split "
                                f"({'model selection' if split == 'val' else 'the final metrics'} needs them)")
    keep = np.zeros(len(labelled), dtype=bool)
    keep[labelled] = stratified_patient_subset(train["patient_id"][labelled], train["multihot"][labelled],
                                               config.finetune.train_fraction, config.train.seed, names)
    return train, labelled, keep


