"""Downstream fine-tuning, linear probing and the supervised-from-scratch baseline: the task for
the shared loop (`coreecg.train.loop.train_worker`); its planner (`plan_finetune`, no Ray) is
`coreecg.train.finetune_plan`, whose names this module still exports.
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

import math
import time
from typing import Any

import numpy as np
import torch

from coreecg.train.augment import ecg_randaugment
from coreecg.checkpoints import BEST_FILE, save_checkpoint
from coreecg.config import Config
from coreecg.data.corpus import unpadded_split
from coreecg.data.reading import read_split
from coreecg.files import write_json
from coreecg.loading import load_encoder, open_source
from coreecg.train.finetune_plan import (  # noqa: F401 - the planner's names, importable here as before
    CONTRACT_KEYS, RANDOM_ENCODER, RANDOM_LABEL, SAME_RUN, FinetuneError, _with_encoder, config_hash,
    leads_label, parse_leads, plan_finetune, preprocess_mismatch,
)
from coreecg.train.ingest import seed_for, to_model_input
from coreecg.train.loop import WorkerContext
from coreecg.train.writer import RunWriter
from coreecg.train.plan import RunPlan
from coreecg.train.step import FinetuneStep, Schedule
from coreecg.encoders.build import build_encoder
from coreecg.eval.downstream import (crop_features, crop_rule, eval_offsets, load_split, predict, predict_features,
                                     score, score_regression, to_records, write_predictions)
from coreecg.eval.figures import tsne_figure
from coreecg.model.classifier import Classifier
from coreecg.train.features import feature_key, load_or_compute, weights_sha256


def random_encoder(config: Config):
    """The encoder `finetune.encoder=random` trains on: `build_encoder(config)` initialised
    from its own generator, seeded by (train.seed, "random-encoder"). The global torch RNG is
    forked, so the draws of everything else (the head, dropout, crops) are those of a run with
    a loaded encoder: the same train.seed gives the same weights, another seed other weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for(config.train.seed, "random-encoder"))
        return build_encoder(config)



class FinetuneTask:
    """The fine-tuning of a plan (`plan_finetune`) on one worker's device."""

    name = "finetune"

    def __init__(self, plan: RunPlan, device: torch.device):
        spec = plan.finetune
        self.config, self.spec, self.corpus, self.device = plan.config, spec, plan.corpus, device
        f = self.config.finetune
        self.epochs, self.global_batch = f.epochs, f.batch_size
        self.class_names, self.multilabel = list(spec.class_names), spec.multilabel
        # a regression task (coreecg.data.tasks): the head predicts values, selected and scored by MAE
        self.scaler = spec.meta.get("target_scaler")
        self.regression = self.scaler is not None
        self.lead_rows = list(spec.lead_rows)
        self._rows = (None if self.lead_rows == list(range(spec.stored_leads))
                      else torch.tensor(self.lead_rows, device=device))
        # Targets by uid: the train split's labels (a regression's values) are tiny next to its signals.
        if self.regression:
            values = read_split(self.corpus, "train", ["target"])["target"].astype(np.float32)
            self.targets = torch.from_numpy(values[:, None]).to(device)
        else:
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
        cfg, f = self.config, self.config.finetune
        # Loading (and the random encoder's own generator) draws no random numbers (coreecg.loading): the head
        # below is initialised alike whichever source (run folder, encoder.pt, export) holds the encoder's weights.
        if self.spec.encoder == RANDOM_ENCODER:
            encoder = random_encoder(cfg)
        else:
            encoder = load_encoder(self.spec.encoder) if self.spec.encoder else build_encoder(cfg)
        model = Classifier.for_mode(encoder, len(self.class_names), f.leads, self.multilabel, f.mode,
                                    f.head, regression=self.regression).to(ctx.device)
        if self.regression:
            model.set_scaler([self.scaler["mean"]], [self.scaler["sd"]])
        self._core = model
        if self.cached:          # draws no random numbers: the encoder is frozen, in eval mode
            self._cache_features(model, ctx)
        schedule = Schedule(ctx.steps_per_epoch, f.epochs, f.warmup_epochs)
        step = FinetuneStep(ctx.wrap(model), cfg, schedule, bare=model)
        step.unpadded = unpadded_split(self.corpus, "train")     # no key-padding mask when none is needed
        return model, step

    def _cache_features(self, model, ctx: WorkerContext) -> None:
        """The frozen encoder's features of val, test (and, with probe_crops=eval, train) under
        the crop rule: reused from the run folder when they are this encoder's and corpus's,
        else computed once (rank 0 saves them)."""
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
        cfg, f = self.config, self.config.finetune
        if self._rows is not None:
            signal = signal[:, self._rows]
        offsets = eval_offsets(signal.shape[-1], cfg.data.crop_samples, f.eval_crops)
        return crop_features(self._core, signal, offsets, cfg.data.crop_samples, cfg.train.precision)[0]

    def start(self, bare, ctx: WorkerContext, writer: RunWriter) -> dict[str, Any]:
        return {}

    def should_evaluate(self, epoch_number: int) -> bool:
        every = self.config.train.eval_every_epochs or self.epochs   # selection needs at least one
        return epoch_number % every == 0 or epoch_number == self.epochs

    def _split(self, name: str):
        if name not in self._splits:
            self._splits[name] = load_split(self.corpus, name)
        return self._splits[name]

    def _records(self, bare, split: str):
        f, data = self.config.finetune, self._split(split)
        if split in self._features:          # a linear probe's cached features: the head alone
            feats = self._features[split]
            return to_records(data, predict_features(bare, feats), feats.cpu().numpy())
        probs, feats = predict(bare, data.signal, self.lead_rows, self.config.data.crop_samples, f.eval_crops,
                               self.device, f.eval_batch_size, self.config.train.precision)
        return to_records(data, probs, feats)

    def evaluate(self, bare, ctx: WorkerContext, writer: RunWriter, epoch: int, step: int,
                 state: dict[str, Any]) -> dict[str, float]:
        """Validation metrics; on a new best macro AUROC (a regression: a new lowest MAE) or at the
        first evaluation, best.pt."""
        t0 = time.perf_counter()
        if self.regression:
            m = score_regression(self._records(bare, "val"), self.scaler["sd"], self.scaler["unit"])
            out = {"val_mae": m["mae"], "val_rmse": m["rmse"]}
            best = state.get("best_val_mae")
            improved = best is None or out["val_mae"] < best
            if improved:
                state.update(best_val_mae=out["val_mae"])
        else:
            m = score(self._records(bare, "val"), self.multilabel, self.class_names)
            nan = float("nan")
            out = {"val_auroc": m["auroc"] if m["auroc"] is not None else nan, "val_acc": m["acc"],
                   "val_f1": m["f1"] if m["f1"] is not None else nan}
            best = state.get("best_val_auroc")
            improved = best is None or (not math.isnan(out["val_auroc"])
                                        and (math.isnan(best) or out["val_auroc"] > best))
            if improved:
                state.update(best_val_auroc=out["val_auroc"])
        if improved:
            # self-contained: what the classifier predicts travels with its weights (coreecg.loading)
            save_checkpoint(ctx.run_dir / BEST_FILE, bare.state_dict(), self.config, task=self.name, epoch=epoch,
                            step=step, val=out, class_names=list(self.class_names), multilabel=self.multilabel,
                            leads=list(self.config.finetune.leads))
            state.update(best_epoch=epoch, best_step=step)
        out["val_seconds"] = time.perf_counter() - t0
        return out

    def finish(self, bare, ctx: WorkerContext, writer: RunWriter, summary: dict[str, float],
               state: dict[str, Any]) -> None:
        """Test metrics, once, with the selected weights; metrics.json, predictions.csv, t-SNE."""
        cfg, f = self.config, self.config.finetune
        best = open_source(ctx.run_dir / BEST_FILE, kind="classifier")       # the one loader: verified
        bare.load_state_dict(best.state)
        payload = best.entries                                                 # epoch, step, val
        seed, n_boot = cfg.train.seed, f.bootstrap_resamples
        val, test = self._records(bare, "val"), self._records(bare, "test")
        if self.regression:
            sd, unit = self.scaler["sd"], self.scaler["unit"]
            selection = {"metric": "validation MAE (lower is better)", "val_mae": payload["val"]["val_mae"]}
            scores = {"test": score_regression(test, sd, unit, n_boot, seed),
                      "val": score_regression(val, sd, unit, n_boot, seed)}
        else:
            selection = {"metric": "validation macro AUROC (one-vs-rest)", "val_auroc": payload["val"]["val_auroc"]}
            scores = {"test": score(test, self.multilabel, self.class_names, n_boot, seed),
                      "val": score(val, self.multilabel, self.class_names, n_boot, seed)}
        metrics = {
            **self.spec.meta,
            "selection": {"metric": selection.pop("metric"), "best_epoch": int(payload["epoch"]),
                          "best_step": int(payload["step"]), **selection,
                          "epochs": self.epochs, "steps": int(summary.get("step", 0))},
            **scores,
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
        write_predictions(ctx.run_dir / "predictions.csv", test, self.class_names, self.regression)
        headline = ("mae", "rmse", "r2") if self.regression else ("acc", "f1", "auroc")
        if f.tsne_max_points and len(test.record_id) >= 5 and not self.regression:
            fig = tsne_figure(test.features, test.y, self.class_names, self.multilabel, seed=seed,
                              max_points=f.tsne_max_points,
                              title=f"{metrics['method']} ({f.mode}) on {metrics['dataset']} test records")
            writer.figure(fig, "tsne", int(payload["epoch"]), int(payload["step"]))
            (ctx.run_dir / "figures" / f"tsne_epoch{int(payload['epoch'])}.png").replace(
                ctx.run_dir / "figures" / "tsne.png")
        writer.line({"event": "test", **{k: metrics["test"][k] for k in headline}})
        writer.scalars("test", {k: metrics["test"][k] for k in headline
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
