"""A run plan: one typed, validated description of a training run, decided before any worker
starts. Every way of starting a run builds one and hands it to the one loop:

    jobs, studies      -> plan_run (plan_pretrain / plan_finetune) -> fit(plan) (Ray Train; coreecg.train.fit)
    Tune trials        -> the same planners             -> the same, or fit(plan, report_fn=...) in the trial's process
    no-Ray reference   -> plan_local                    -> coreecg.train.loop.run_local

The planners (`coreecg.train.pretraining.plan_pretrain`, `coreecg.train.finetuning.plan_finetune`,
`plan_local` here) resolve the corpus, count batches, check the run folder and, for
fine-tuning, fix the label subset and the metrics.json fields; they start no training. One
exception writes: the embedded synthetic corpus is built (a Ray Data job) on first use, so
callers start Ray first (`coreecg.train.fit.plan_run`, the study runner).
A worker receives `plan.to_dict()` (plain data: a plugin method's options re-import on the
worker) and rebuilds it with `RunPlan.from_dict`.
A planner opens each corpus once (`coreecg.data.corpus.open_corpus`: the manifest read, its
sha256 taken) and the plan keeps the opened corpora (`RunPlan.opened`); the fingerprint checks,
the run record and the ingest get them through `RunPlan.open`. `to_dict` hands them to the
workers, which adopt them (`coreecg.data.corpus.adopt_corpus`): a worker reads no manifest the
driver read.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from coreecg.checkpoints import CHECKPOINT_FILE, CheckpointError, checkpoint_dirs, load_checkpoint, verify_checkpoint
from coreecg.config import Config, ConfigError, config_from_dict, load_config
from coreecg.data.corpus import OpenCorpus, adopt_corpus, open_corpus
from coreecg.data.fingerprints import corpus_record
from coreecg.data.overlap import OVERLAP_CSV
from coreecg.extras import RAY_EXTRA_MODULES, TRAINING, require_ray_extra
from coreecg.run_record import start_session
from coreecg.train.mixture import Mixture
from coreecg.train.resume_check import changed_keys, check_compatible


TASKS = ("pretrain", "finetune")


class PlanError(ValueError):
    """A run that cannot be planned (the message names the key or file)."""


@dataclass(frozen=True)
class FinetuneSpec:
    """What a fine-tuning fixes before training (`plan_finetune`)."""

    encoder: str                    # encoder checkpoint, "" for the supervised baseline
    lead_rows: tuple[int, ...]      # stored lead rows fed to the model, in finetune.leads order
    stored_leads: int
    stored_samples: int             # samples per stored window
    class_names: tuple[str, ...]
    multilabel: bool
    meta: dict[str, Any]            # metrics.json fields known before training
    kept_patients: tuple[str, ...]  # patients of the label subset (train_subset.csv)
    overlap_csv: str = ""           # records shared with the encoder's pretraining (overlap.csv), allowed


@dataclass(frozen=True)
class RunPlan:
    """One run. `keep` (the train subset, (N,) bool over the split's uids) stays on the driver:
    the dataset is built there; workers get the plan without it."""

    task: str                               # "pretrain" | "finetune"
    config: Config                          # resolved: train.run_dir is the run folder
    corpus: Path | None                     # None: in-memory windows (the no-Ray reference)
    train_windows: int                      # windows trained on per epoch (after `keep`)
    steps_per_epoch: int                    # full batches per epoch on every rank
    probe_corpus: Path | None = None        # pretraining: the representation probe's corpus
    finetune: FinetuneSpec | None = None    # fine-tuning only
    resume_notes: tuple[str, ...] = ()      # config keys changed against the saved run
    finished: bool = False                  # the run folder holds this very run, done (fine-tuning)
    keep: np.ndarray | None = field(default=None, compare=False, repr=False)
    # pretraining on several corpora: coreecg.train.mixture.Mixture (`corpus` is then its first);
    # its keep masks stay on the driver like `keep`
    mixture: Any = field(default=None, compare=False, repr=False)
    # the corpora the planner opened, by path (given as a sequence of OpenCorpus); a worker's plan
    # holds the driver's (to_dict / from_dict), and opens any other once (`open`)
    opened: dict[str, OpenCorpus] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._keep_opened()
        if self.task not in TASKS:
            raise PlanError(f"task {self.task!r}: expected one of {TASKS}")
        if (self.task == "finetune") != (self.finetune is not None):
            raise PlanError(f"a {self.task} plan {'needs' if self.task == 'finetune' else 'takes no'} FinetuneSpec")
        if self.steps_per_epoch < 1 or self.train_windows < self.global_batch:
            raise PlanError(f"{self.corpus}: {self.train_windows} training windows give no full batch of "
                            f"{self.global_batch}")
        if self.keep is not None and int(np.count_nonzero(self.keep)) != self.train_windows:
            raise PlanError(f"{self.corpus}: the train subset holds {int(np.count_nonzero(self.keep))} windows, "
                            f"the plan {self.train_windows}")

    def _keep_opened(self) -> None:
        """`opened` as a dict by path; `corpus` and `probe_corpus` given opened: their paths kept
        in the plan, the objects in `opened`."""
        given = self.opened.values() if isinstance(self.opened, dict) else self.opened
        opened = {str(c.path): c for c in given}
        for name in ("corpus", "probe_corpus"):
            value = getattr(self, name)
            if isinstance(value, OpenCorpus):
                opened.setdefault(str(value.path), value)
                object.__setattr__(self, name, value.path)      # frozen: set once, here
        object.__setattr__(self, "opened", opened)

    @property
    def run_dir(self) -> Path:
        return self.config.train.run_dir

    def open(self, corpus: str | Path) -> OpenCorpus:
        """The corpus at `corpus` as this plan opened it: the planner's, else opened now and kept."""
        key = str(corpus)
        if key not in self.opened:
            self.opened[key] = open_corpus(corpus)
        return self.opened[key]

    @property
    def epochs(self) -> int:
        return self.config.finetune.epochs if self.task == "finetune" else self.config.optim.epochs

    @property
    def global_batch(self) -> int:
        return self.config.finetune.batch_size if self.task == "finetune" else self.config.optim.batch_size

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a worker (no `keep`): the opened corpora travel with their manifests."""
        return {"task": self.task, "config": self.config.to_dict(),
                "corpus": str(self.corpus) if self.corpus else None, "train_windows": self.train_windows,
                "steps_per_epoch": self.steps_per_epoch,
                "probe_corpus": str(self.probe_corpus) if self.probe_corpus else None,
                "finetune": dataclasses.asdict(self.finetune) if self.finetune else None,
                "resume_notes": list(self.resume_notes), "finished": self.finished,
                "mixture": self.mixture.to_dict() if self.mixture is not None else None,
                "opened": [c.to_dict() for c in self.opened.values()]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunPlan":
        spec = d["finetune"]
        if spec is not None:
            spec = FinetuneSpec(**{**spec, **{k: tuple(spec[k]) for k in ("lead_rows", "class_names",
                                                                           "kept_patients")}})
        return cls(task=d["task"], config=config_from_dict(d["config"]),
                   corpus=Path(d["corpus"]) if d["corpus"] else None, train_windows=int(d["train_windows"]),
                   steps_per_epoch=int(d["steps_per_epoch"]),
                   probe_corpus=Path(d["probe_corpus"]) if d["probe_corpus"] else None, finetune=spec,
                   resume_notes=tuple(d["resume_notes"]), finished=bool(d["finished"]), mixture=_mixture(d),
                   opened=[adopt_corpus(c) for c in d.get("opened") or ()])

    def describe(self) -> list[str]:
        """The console's account of the run, before it starts."""
        cfg, t = self.config, self.config.train
        lines = [f"run folder: {self.run_dir}"]
        if self.task == "pretrain":
            lines += [f"method: {cfg.method_label} (pretrain.method={cfg.pretrain.method})",
                      "corpus: " + (str(self.corpus) if self.mixture is None
                                    else f"a mixture of {len(self.mixture.corpora)}") +
                      f" ({self.train_windows} training windows, {self.steps_per_epoch} "
                      f"steps/epoch of {self.global_batch} over {t.num_workers} worker(s))",
                      *(_mixture_lines(self.mixture) if self.mixture is not None else []),
                      "probe: " + (str(self.probe_corpus) if self.probe_corpus else
                                   "none (the training corpus has no labels; set data.probe_corpus)")]
        else:
            f, meta = cfg.finetune, self.finetune.meta
            lines += [f"task: {meta['dataset']} ({len(meta['class_names'])} classes, "
                      f"{'multi' if meta['multilabel'] else 'single'}-label), mode {f.mode}, leads {meta['leads']}, "
                      f"method {meta['method']}",
                      f"train: {self.train_windows} windows of {len(self.finetune.kept_patients)} patients "
                      f"(fraction {f.train_fraction}), {self.steps_per_epoch} steps/epoch of {self.global_batch} "
                      f"over {t.num_workers} worker(s)"]
            if meta["classes_absent_from_train"]:
                lines.append(f"warning: no training window of {meta['classes_absent_from_train']}")
            lines += _leakage_lines(meta.get("leakage") or {})
            if meta.get("preprocess_mismatch"):
                lines.append("warning: the corpus is preprocessed otherwise than the encoder's input contract ("
                             + "; ".join(meta["preprocess_mismatch"]) + "); rebuild it with the encoder's "
                             "data.preprocess to feed what it was pretrained on (docs/published_encoders.md)")
        if self.resume_notes:
            lines.append(f"resuming with changed settings: {', '.join(self.resume_notes)}")
        return lines


def _mixture(d: dict[str, Any]) -> Any:
    if not d.get("mixture"):
        return None

    return Mixture.from_dict(d["mixture"])


def _mixture_lines(mixture: Any) -> list[str]:
    """A mixture's corpora: windows per epoch, weight, and the duplicates left out."""
    out = []
    for c in mixture.record()["corpora"]:
        dup = c.get("dropped_windows") or 0
        out.append(f"  {c['corpus']}: {c['windows_per_epoch']} windows/epoch (weight {c['weight']:.3f}, "
                   f"{c['train_windows']} train windows" + (f"; {dup} duplicate window(s) of "
                                                            f"{', '.join(c['duplicate_of'])} left out" if dup else "")
                   + ")")
    return out


def _leakage_lines(leak: dict[str, Any]) -> list[str]:
    """The console's warning when finetune.allow_overlap let a leaking or unchecked run through,
    and when the two corpora's preprocessing differs (fingerprints may then miss a copy)."""
    if leak.get("warning"):
        return [f"warning: leakage guard: {leak['warning']}", *_leakage_lines({**leak, "warning": None})]
    if leak.get("overlap"):
        return [f"warning: {leak['b_records']} val/test record(s) share a patient or a recording with the encoder's "
                "pretraining corpus (allowed by finetune.allow_overlap; listed in overlap.csv)"]
    if leak.get("allowed") and leak.get("checked") is False and leak.get("pretraining_corpus"):
        return [f"warning: leakage not checked (allowed by finetune.allow_overlap): {leak['reason']}"]
    return []


# ---------------------------------------------------------------------------- shared planning steps


def steps_per_epoch(corpus: Path | str | None, n_windows: int, global_batch: int, num_workers: int,
                    key: str) -> int:
    """Full batches per epoch on every rank (PlanError naming `key` when there is not even one)."""
    steps = (n_windows // num_workers) // max(1, global_batch // num_workers)
    if steps == 0:
        raise PlanError(f"{corpus}: {n_windows} training windows give no full batch of {global_batch} "
                        f"over {num_workers} workers; lower {key}")
    return steps


def preflight(run_dir: Path, config: Config, same_run: Sequence[str] = ()) -> list[str]:
    """The one check of a run folder, before any worker starts: an existing folder must hold this
    model's config (and the same values of the dotted `same_run` keys: what makes it this run)
    and intact checkpoints (CheckpointError naming the file otherwise). Returns the config keys
    that differ from the saved run (allowed: schedule, logging, data; reported on resume); none
    when the folder is new. MissingExtra first where the `ray` extra is not all installed."""
    require_ray_extra(TRAINING, RAY_EXTRA_MODULES)
    backend = {"mlflow": "MLflow", "wandb": "Weights & Biases"}.get(config.train.tracking)
    if backend and importlib.util.find_spec(config.train.tracking) is None:
        raise PlanError(f"train.tracking={config.train.tracking} needs {backend}, which is not installed: "
                        f"pip install 'coreecg[{config.train.tracking}]'")
    uri = config.train.tracking_uri
    if config.train.tracking == "wandb" and uri and not uri.startswith(("http://", "https://")):
        raise PlanError(f"train.tracking_uri={uri}: W&B logs to a server (http:// or https://); "
                        "leave it empty for offline files in the run folder")
    notes: list[str] = []
    saved_yaml = run_dir / "config.yaml"
    if saved_yaml.is_file():
        try:
            saved = load_config(saved_yaml)
        except ConfigError as e:
            raise CheckpointError(f"{saved_yaml}: the run folder's config is not valid here: {e}") from e
        a, b = saved.to_dict(), config.to_dict()
        other = [f"{k}: {_get(a, k)!r} -> {_get(b, k)!r}" for k in same_run if _get(a, k) != _get(b, k)]
        if other:
            raise CheckpointError(f"{run_dir}: holds a run with other settings ({'; '.join(other)}); "
                                  "use another --output")
        check_compatible(saved_yaml, saved, config)
        notes = changed_keys(saved, config)
    dirs = checkpoint_dirs(run_dir)
    for d in dirs[:-1]:
        verify_checkpoint(d / CHECKPOINT_FILE)
    if dirs:
        _, saved = load_checkpoint(dirs[-1] / CHECKPOINT_FILE)
        check_compatible(dirs[-1] / CHECKPOINT_FILE, saved, config)
    return notes


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        d = d[part]
    return d


def plan_local(config: Config, n_windows: int, run_dir: str | Path | None = None, task: str = "pretrain") -> RunPlan:
    """The no-Ray reference's plan: in-memory windows, one process, the run folder `run_dir`
    (default train.run_dir). Pretraining only: fine-tuning needs a corpus's splits."""
    if task != "pretrain":
        raise PlanError("the in-memory reference runs pretraining only; fine-tune through plan_finetune")
    if run_dir is not None:
        run_dir = Path(run_dir).resolve()
        config = dataclasses.replace(config, train=dataclasses.replace(
            config.train, storage_path=str(run_dir.parent), name=run_dir.name)).validate()
    bs = config.optim.batch_size
    if n_windows < bs:
        raise PlanError(f"{n_windows} windows are fewer than one batch of {bs}")
    return RunPlan("pretrain", config, None, n_windows, n_windows // bs)


def write_run_folder(plan: RunPlan) -> Path:
    """Create the run folder with its config.yaml, a new session in run.json
    (coreecg.run_record; a pretraining's names its corpus and fingerprint file, of the corpora
    the plan opened) and a fine-tuning's train_subset.csv (and overlap.csv when the leakage guard
    was overruled)."""
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    plan.config.to_yaml(run_dir / "config.yaml")
    data = None
    if plan.task == "pretrain" and plan.mixture is not None:
        mix = plan.mixture.record()
        data = {**mix, "corpora": [{**corpus_record(plan.open(c["corpus"])), **c} for c in mix["corpora"]]}
    elif plan.task == "pretrain" and plan.corpus:
        data = corpus_record(plan.open(plan.corpus))
    start_session(run_dir, data)
    if plan.finetune is not None:
        (run_dir / "train_subset.csv").write_text(
            "patient_id\n" + "".join(f"{p}\n" for p in plan.finetune.kept_patients))
        if plan.finetune.overlap_csv:
            (run_dir / OVERLAP_CSV).write_text(plan.finetune.overlap_csv)
    return run_dir
