"""The pretraining task for the shared loop (`coreecg.train.loop.train_worker`): the configured
method (`pretrain.method`: CoRe-ECG, MoCo v3, CMSC or a plugin's) and its step, random
2,250-sample crops, the representation probe and (for methods that reconstruct) the
reconstruction figure each eval epoch, and `encoder.pt` at the end; and its planner
(`plan_pretrain`: corpus, batches, probe and run folder checks, no Ray)."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coreecg.config.encoders import check_encoder_for_method
from coreecg.checkpoints import ENCODER_FILE, save_encoder
from coreecg.config import Config, ConfigError
from coreecg.methods import PretrainMethod, build_method, method_class
from coreecg.train.ingest import to_model_input
from coreecg.train.loop import WorkerContext, run_local
from coreecg.train.writer import RunWriter
from coreecg.train.plan import PlanError, RunPlan, plan_local, preflight, steps_per_epoch
from coreecg.train.step import PretrainStep, Schedule
from coreecg.cluster import with_devices
from coreecg.data.corpus import open_corpora, unpadded_split
from coreecg.data.locate import probe_corpus, training_corpora
from coreecg.data.reading import patient_index, read_split, split_rows, splits_of
from coreecg.run_record import hparams
from coreecg.train.mixture import resolve_mixture

# Lazy imports: the evaluation (scikit-learn, the `ray` extra: 0.8 s) and the figures, where a rank
# evaluates: a run without evaluation imports neither, and planning names a missing extra.

log = logging.getLogger(__name__)


class PretrainTask:
    """probe: coreecg.eval.probe.ProbeData (rank 0; None: no probe); figure_windows: (W, C, crop)
    fixed validation windows for the reconstruction figure (rank 0; None: no figure);
    patient_of: (N,) int64 patient index of every train uid, for methods that need patient ids
    (None: every window is its own patient, e.g. in-memory windows); unpadded: every training
    corpus's manifest counts no padded window in its train split (`coreecg.data.corpus.unpadded_split`:
    attention runs without a key-padding mask where it can)."""

    name = "pretrain"

    def __init__(self, config: Config, probe: Any = None, figure_windows: torch.Tensor | None = None,
                 patient_of: torch.Tensor | None = None, mixture: Any = None, unpadded: bool = False):
        self.config, self.probe, self.figure_windows = config, probe, figure_windows
        self.unpadded = unpadded
        self.epochs, self.global_batch = config.optim.epochs, config.optim.batch_size
        self.patient_of = patient_of
        self.needs_patient_ids = False
        self.mixture = mixture              # coreecg.train.mixture.Mixture: windows per corpus are counted
        self._per_corpus: torch.Tensor | None = None
        self._bounds: torch.Tensor | None = None

    def build(self, ctx: WorkerContext) -> tuple[PretrainMethod, PretrainStep]:
        cfg = self.config
        bare = build_method(cfg).to(ctx.device)
        if ctx.world_size > 1 and ctx.device.type == "cuda":
            # BatchNorm heads (MoCo v3) normalise over the global batch, as MoCo v3 does.
            bare = torch.nn.SyncBatchNorm.convert_sync_batchnorm(bare)
        self.needs_patient_ids = bare.needs_patient_ids
        if self.patient_of is not None:
            self.patient_of = self.patient_of.to(ctx.device)
        schedule = Schedule(ctx.steps_per_epoch, cfg.optim.epochs, cfg.optim.warmup_epochs)
        step = PretrainStep(ctx.wrap(bare), cfg, schedule, bare=bare)
        step.unpadded = self.unpadded
        return bare, step

    def inputs(self, signal: torch.Tensor, uid: torch.Tensor, epoch: int,
               generator: torch.Generator) -> tuple[tuple, dict]:
        x = to_model_input(signal, uid, self.config.train.seed, epoch, self.config.data.crop_samples)
        if self.mixture is not None:        # summed on the device: no host sync per step
            if self._bounds is None or self._bounds.device != uid.device:
                self._bounds = self.mixture.bounds(uid.device)
            counts = torch.bincount(self.mixture.corpus_of(uid, self._bounds), minlength=len(self.mixture.corpora))
            self._per_corpus = counts if self._per_corpus is None else self._per_corpus + counts
        kwargs: dict[str, Any] = {"generator": generator}
        if self.needs_patient_ids:
            kwargs["patient"] = self.patient_of[uid] if self.patient_of is not None else uid
        return (x,), kwargs

    def start(self, bare: PretrainMethod, ctx: WorkerContext, writer: RunWriter) -> dict[str, Any]:
        if self.mixture is not None:
            writer.line({"event": "mixture", "step": 0, "epoch": 0, **self.mixture.record()})
        if self.probe is None or not self.config.train.eval_every_epochs:
            return {}
        scores = self._objectives(bare, ctx)
        auroc = scores["probe_auroc"]
        writer.line({"event": "probe_init", "step": 0, "epoch": 0, "probe_auroc": auroc,
                     **{k: scores[k] for k in ("knn_auroc", "rankme") if k in scores}})
        log.info("probe_auroc of the randomly initialised encoder: %.4f", auroc)
        return {"probe_auroc_init": auroc}

    def epoch_record(self, ctx: WorkerContext) -> dict[str, Any]:
        """metrics.jsonl's per-corpus account of the epoch just trained (every rank calls it: one
        all-reduce): windows drawn (the epoch's quota) and trained (in full batches, all ranks;
        a resumed epoch counts its steps since the resume) per corpus."""
        if self.mixture is None:
            return {}
        n = len(self.mixture.corpora)
        trained = self._per_corpus if self._per_corpus is not None else torch.zeros(n, dtype=torch.long)
        trained = trained.to(ctx.device)
        if ctx.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(trained)
        self._per_corpus = None
        return {"mixture": [{"corpus": c, "drawn": int(q), "trained": int(t)}
                            for c, q, t in zip(self.mixture.names(), self.mixture.quotas, trained.tolist())]}

    def should_evaluate(self, epoch_number: int) -> bool:
        every = self.config.train.eval_every_epochs
        return bool(every) and (epoch_number % every == 0 or epoch_number == self.epochs)

    def _objectives(self, bare: PretrainMethod, ctx: WorkerContext) -> dict[str, float]:
        """Every registered objective (coreecg.eval.objectives) on the probe corpus, embedded once."""
        from coreecg.eval.layer_probe import lead_index, layer_embeddings
        from coreecg.eval.objectives import Embeddings, compute_objectives
        from coreecg.eval.probe import embed

        d, p = self.config.data, self.probe
        layers = None
        if d.probe_layers:        # every block's features from the same pass; the last is `embed`'s
            lead_idx = lead_index(p.leads, ctx.device)
            per_split = [[f.astype(np.float64) for f in layer_embeddings(bare.encoder, s.windows, d.crop_samples, 1,
                                                                         ctx.device, lead_idx)]
                         for s in (p.train, p.val)]
            layers = list(zip(*per_split))
            train_x, val_x = layers[-1]
        else:
            train_x = embed(bare.encoder, p.train.windows, d.crop_samples, ctx.device, leads=p.leads)
            val_x = embed(bare.encoder, p.val.windows, d.crop_samples, ctx.device, leads=p.leads)
        return compute_objectives(Embeddings(train_x, val_x, p, d.probe_labels_per_class, d.probe_subsets, layers))

    def evaluate(self, bare: PretrainMethod, ctx: WorkerContext, writer: RunWriter, epoch: int, step: int,
                 state: dict[str, Any]) -> dict[str, float]:
        """The objectives on the probe corpus (with the collapse check) and the reconstruction figure."""
        from coreecg.eval.objectives import collapse_reason

        out: dict[str, float] = {}
        if self.probe is not None:
            t0 = time.perf_counter()
            out.update(self._objectives(bare, ctx))
            out["probe_seconds"] = time.perf_counter() - t0
            reason = collapse_reason(out, self.config.train.collapse_rankme)
            out["collapsed"] = float(reason is not None)
            if reason is not None:
                stop = (" (train.stop_on_collapse: a sweep stops this trial)"
                        if self.config.train.stop_on_collapse else "")
                log.warning("collapse at epoch %d: %s%s", epoch, reason, stop)
                writer.line({"event": "collapse", "epoch": epoch, "step": step, "reason": reason})
        if self.figure_windows is not None and bare.can_reconstruct:
            from coreecg.eval.figures import reconstruction_figure

            fig = reconstruction_figure(bare, self.figure_windows, seed=self.config.train.seed,
                                        title=f"epoch {epoch}, step {step}: original (blue), reconstruction of "
                                              "masked patches (red); grey: masked, hatched: dropped")
            writer.figure(fig, "reconstruction", epoch, step)
        return out

    def finish(self, bare: PretrainMethod, ctx: WorkerContext, writer: RunWriter, summary: dict[str, float],
               state: dict[str, Any]) -> None:
        path = save_encoder(ctx.run_dir / ENCODER_FILE, bare, self.config,
                            step=int(summary.get("step", 0)), metrics=summary)
        log.info("encoder exported: %s", path)
        final = {k: summary[k] for k in ("loss", *bare.reported_losses, "probe_auroc", "probe_auroc_full",
                                         "probe_auroc_init", "knn_auroc", "rankme") if k in summary}
        writer.hparams(hparams(self.config), final, int(summary.get("step", 0)))


def plan_pretrain(config: Config) -> RunPlan:
    """A pretraining's plan: its corpus (data.corpus or the embedded synthetic one), batches per
    epoch over train.num_workers, the probe's corpus, and the run folder's checks (`preflight`)."""
    config = with_devices(config)       # train.use_gpu/num_workers=auto not resolved by a job (plan_run): here
    t = config.train
    try:                               # the method can train the encoder (and it is not a published family's)
        check_encoder_for_method(config)
    except ConfigError as e:
        raise PlanError(str(e)) from None
    mixture = None
    corpora = open_corpora(training_corpora(config))   # each manifest read once; the plan keeps them
    _check_leads(config, corpora)
    if config.data.is_mixture:                # several corpora: coreecg.train.mixture, docs/mixtures.md

        mixture = resolve_mixture(corpora, config.data.corpus_weights)
        corpus, n, probe = corpora[0], mixture.epoch_windows, probe_corpus(config, corpora)
    else:
        corpus = corpora[0]
        n, probe = split_rows(corpus, "train"), probe_corpus(config, corpus)
    epoch_steps = steps_per_epoch(corpus if mixture is None else "data.corpus (mixture)", n, config.optim.batch_size,
                          t.num_workers, "optim.batch_size")
    notes = preflight(t.run_dir, config)
    return RunPlan("pretrain", config, corpus, n, epoch_steps, probe_corpus=probe, resume_notes=tuple(notes),
                   mixture=mixture, opened=corpora)


def _check_leads(config: Config, corpora: list[Any]) -> None:
    """PlanError unless every corpus stores the leads data.preprocess.leads names, in that order:
    each row is fed the embedding of the lead named there (PretrainMethod.lead_idx), so a lead-II
    corpus read as lead I would train the wrong lead's embedding without an error."""
    wanted = list(config.data.preprocess.leads)
    for corpus in corpora:
        stored = list(corpus.manifest["signal"]["leads"])
        if stored != wanted:
            raise PlanError(f"{corpus.path} stores the leads {stored}, but data.preprocess.leads is {wanted}: set "
                            f"data.preprocess.leads=[{','.join(stored)}] (pretraining feeds each row its lead's "
                            "embedding by these names)")


def figure_windows(corpus: Path, crop: int, n: int = 2) -> torch.Tensor:
    """The reconstruction figure's fixed windows: `n` evenly spaced validation windows (train
    windows when the corpus has no val split), centre-cropped: (n, C, crop) float32."""
    from coreecg.eval.probe import center_crop

    split = "val" if "val" in splits_of(corpus) else "train"
    windows = read_split(corpus, split, ["signal"], max_windows=n)["signal"]
    return center_crop(torch.from_numpy(windows), crop)


def task_from_plan(plan: RunPlan, rank: int) -> PretrainTask:
    """The task a worker runs: the probe's data and the figure's windows on rank 0 only (none when
    train.eval_every_epochs is 0: nothing evaluates); patient ids of the train split for methods
    that need them (CMSC)."""
    cfg = plan.config
    probe = figures = None
    if rank == 0 and cfg.train.eval_every_epochs:   # no evaluation, nothing to read (2.9 s of a start-up)
        from coreecg.eval.probe import load_probe_data     # and no sklearn to import (0.8 s)

        probe = load_probe_data(plan.open(plan.probe_corpus), cfg.data.probe_max_windows) if plan.probe_corpus else None
        figures = figure_windows(plan.open(plan.corpus), cfg.data.crop_samples) if cfg.train.figures else None
    patient_of = None
    if method_class(cfg.pretrain.method).needs_patient_ids:
        parts, base = [], 0
        for corpus in (plan.mixture.corpora if plan.mixture is not None else [plan.corpus]):
            index = patient_index(plan.open(corpus), "train")       # a mixture's corpora: patients kept apart
            parts.append(index + base)
            base += int(index.max()) + 1 if len(index) else 0
        patient_of = torch.from_numpy(np.concatenate(parts))
    corpora = plan.mixture.corpora if plan.mixture is not None else [plan.corpus]
    return PretrainTask(cfg, probe, figures, patient_of, mixture=plan.mixture,
                        unpadded=all(unpadded_split(plan.open(c), "train") for c in corpora))


def pretrain_local(config: Config, windows: np.ndarray, run_dir: str | Path | None = None,
                   probe: Any = None, patient_of: np.ndarray | None = None) -> dict[str, float]:
    """The no-Ray reference pretraining on in-memory windows (n, C, T_stored); see `run_local`.
    patient_of: (n,) patient id of each window (methods that need patient ids); None: one per window."""
    patient = torch.as_tensor(patient_of, dtype=torch.int64) if patient_of is not None else None
    plan = plan_local(config, len(windows), run_dir)
    return run_local(plan, PretrainTask(plan.config, probe, patient_of=patient), windows)
