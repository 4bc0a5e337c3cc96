"""The fine-tuning planner (`plan_finetune`, no Ray): every check that can fail before training
and the run's fixed facts as a RunPlan, with the naming helpers a plan and its report use (the
dataset key, the lead-set label, the config hash). The task that trains a plan is
`coreecg.train.finetuning.FinetuneTask`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from coreecg.encoders.registry import is_published
from coreecg.checkpoints import CheckpointError
from coreecg.cluster import with_devices
from coreecg.config import Config, FinetuneConfig, ModelConfig, PreprocessConfig
from coreecg.data.corpus import open_corpus
from coreecg.data.locate import training_corpus
from coreecg.data.sources import dataset_key
from coreecg.data.leads import LEAD_SETS, LeadSetError, parse_lead_set
from coreecg.data.reading import META_COLUMNS, read_split
from coreecg.data.subsets import stratified_patient_subset, subset_summary
from coreecg.loading import open_source
from coreecg.model.published import family
from coreecg.train.leakage_guard import Pretraining, check_overlap, pretraining_of
from coreecg.data.tasks import LABELS, corpus_task
from coreecg.train.plan import FinetuneSpec, RunPlan, preflight, steps_per_epoch

log = logging.getLogger(__name__)

# What makes a run folder one fine-tuning: another value of these is another run (refused).
SAME_RUN = ("data.corpus", "finetune.encoder", "finetune.mode", "finetune.leads", "finetune.train_fraction",
            "finetune.probe_crops", "train.seed", "finetune.head", "finetune.layer_decay")


# finetune.encoder=random: a seeded, randomly initialised encoder of the `model` section's
# architecture (the "Random init" rows: what pretraining adds over an untrained network).
RANDOM_ENCODER = "random"
RANDOM_LABEL = "Random init"


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
    """"12" / "6" / "1" for the paper's lead sets (in any row order: a published family's contract
    may order them its own way, MERL's aVF before aVL), else the names joined by commas."""
    for label, names in LEAD_SETS.items():
        if len(leads) == len(names) and set(leads) == set(names):
            return label
    return ",".join(leads)


def config_hash(config: Config) -> str:
    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def plan_finetune(config: Config) -> RunPlan:
    """Every check that can fail before training, and the run's fixed facts, as a RunPlan.

    FinetuneError / CheckpointError / SubsetError (ValueErrors naming the file or key) for: a
    corpus without labels or without labelled val/test windows, a lead it does not store, an
    encoder checkpoint that is unreadable, holds no encoder, or has another shape than asked,
    a scratch run given an encoder (or a fine-tune given none), a fraction that empties a class,
    a run folder that holds another run; LeakageError when the encoder's pretraining corpus shares
    records or patients with the val/test splits (unless finetune.allow_overlap; docs/leakage.md).
    """
    config = with_devices(config)       # train.use_gpu/num_workers=auto not resolved by a job (plan_run): here
    corpus = open_corpus(training_corpus(config))      # its manifest read once, from here to the ingest
    manifest = corpus.manifest
    names = list(manifest["class_names"])
    if not names:
        raise FinetuneError(f"{corpus}: the corpus has no labels (class_names is empty); fine-tuning needs a "
                            "labelled corpus (build it with a label view)")
    stored = list(manifest["signal"]["leads"])
    config, task = _with_task(config, corpus)
    # the encoder first: a published family's contract fixes the leads and the corpus it takes
    config, encoder_hash, method, pretraining, contract = _with_encoder(config)
    mismatch = preprocess_mismatch(contract, manifest, corpus)
    missing = [x for x in config.finetune.leads if x not in stored]
    if missing:
        raise FinetuneError(f"{corpus}: finetune.leads {missing} are not stored in this corpus (it has {stored})")
    f = config.finetune
    if f.mode in ("linear", "frozen") and f.lr != FinetuneConfig.lr:
        # a head-only mode trains at linear_lr; an lr set for it is almost always meant for it
        log.warning("finetune.lr=%g is not used in mode %s: the head-only modes train at finetune.linear_lr=%g "
                    "(set that instead)", f.lr, f.mode, f.linear_lr)
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
        "method": method, "dataset": f.dataset or dataset_key(manifest), "mode": f.mode,
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
    if task["kind"] != LABELS:       # label tasks' metrics.json stay as they were
        meta["task"] = task
    if task["kind"] == "regression":
        meta["target_scaler"] = _target_scaler(corpus, keep, task)
    if mismatch:
        meta["preprocess_mismatch"] = mismatch
    if config.data.preprocess.contract:     # the leads are the published model's own (its contract's), all of them
        meta["contract_leads"] = True
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


def _with_task(config: Config, corpus) -> tuple[Config, dict[str, Any]]:
    """The corpus's task (coreecg.data.tasks) recorded in finetune.task, so that a run's config says what its
    head predicts; FinetuneError when finetune.task names another task than the corpus's."""
    task = corpus_task(corpus.manifest)
    own = "" if task["kind"] == LABELS else str(task["name"])
    asked = config.finetune.task
    if asked not in ("", own) and not (asked == LABELS and not own):
        raise FinetuneError(f"{corpus}: finetune.task={asked} but the corpus is of the task "
                            f"{own or 'labels (its statements)'}; build a corpus of that task "
                            f"(--set data.sources.<source>.task={asked})")
    return dataclasses.replace(config, finetune=dataclasses.replace(config.finetune, task=own)), task


def _target_scaler(corpus, keep: np.ndarray, task: dict[str, Any]) -> dict[str, Any]:
    """The regression target's scaler: mean and SD over the train subset's records (one value per
    record, whatever its windows), the standardisation the head trains on and undoes."""
    d = read_split(corpus, "train", ["record_id", "target"])
    values = dict(zip(d["record_id"][keep], d["target"][keep].astype(np.float64)))
    y = np.array(list(values.values()))
    sd = float(y.std(ddof=1)) if len(y) > 1 else 0.0
    if not sd > 0:
        raise FinetuneError(f"{corpus}: the train subset's {task['name']} is constant ({len(y)} record(s)): "
                            "a regression needs targets that vary")
    return {"mean": float(y.mean()), "sd": sd, "records": int(len(y)), "unit": task.get("unit", "")}


def _leakage_check(pretraining: Pretraining | None, corpus: Path, allow: bool,
                   reason: str = "trained from scratch: no encoder"):
    """The leakage guard (coreecg.train.leakage_guard): metrics.json's "leakage" entry and the overlap;
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
    if encoder.contract or saved.get("contract"):   # a published family's declared contract: the corpus's own
        if saved.get("contract") != encoder.contract or tuple(saved.get("leads") or ()) != tuple(encoder.leads):
            built = f"the {saved['contract']} contract" if saved.get("contract") else "coreecg's preprocessing"
            raise FinetuneError(
                f"{corpus}: built with {built}, but the encoder takes the {encoder.contract or 'coreecg'} input "
                f"contract; build its corpus once from the same raw records: python jobs/preprocess.py --source "
                f"{manifest.get('source', 'SOURCE')} --input RAW --output {corpus}-{encoder.contract or 'coreecg'} "
                + (f"--set data.preprocess.contract={encoder.contract}"
                   + (f" --set 'data.preprocess.leads=[{','.join(encoder.leads)}]'" if len(encoder.leads) == 1 else "")
                   if encoder.contract else "")
                + " (a study builds it itself: docs/published_encoders.md)")
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
    if is_published(config.model.arch):     # a family the registry declares: its adapter module too
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
    if saved.data.preprocess.contract:        # a contract corpus's rows are the model's own leads, in its order
        # and its window is the model's whole input: one evaluation crop (more would be the same crop)
        f = dataclasses.replace(f, leads=tuple(saved.data.preprocess.leads), eval_crops=1)
    config = dataclasses.replace(
        config, model=saved.model, encoders=_encoder_sections(config, saved, path),
        # the encoder's plugins travel with it: the fine-tuned run (and what is made from it) loads
        # in a fresh process that has only its config
        plugins=tuple(dict.fromkeys([*config.plugins, *saved.plugins])),
        data=dataclasses.replace(config.data, crop_samples=saved.model.input_samples,
                                 # a contract corpus's settings are the contract's stored form (its window)
                                 **({"preprocess": saved.data.preprocess} if saved.data.preprocess.contract else {})),
        finetune=dataclasses.replace(f, encoder=str(path))).validate()
    return (config, config_hash(saved), config.finetune.method or saved.method_label, pretraining_of(src),
            saved.data.preprocess)


def _encoder_sections(config: Config, saved: Config, path: Path):
    """The config's `encoders` with the checkpoint's own section of its encoder (its sizes);
    CheckpointError when the config asks for other sizes than the default."""
    arch = saved.model.arch
    if arch not in saved.encoders.names(arch):
        return config.encoders
    mine, theirs = getattr(config.encoders, arch), getattr(saved.encoders, arch)
    if mine != type(mine)() and mine != theirs:
        diff = [f"encoders.{arch}.{k.name}: {getattr(theirs, k.name)} in the checkpoint, {getattr(mine, k.name)} asked"
                for k in dataclasses.fields(mine) if getattr(theirs, k.name) != getattr(mine, k.name)]
        raise CheckpointError(f"{path}: an encoder of another shape than the config asks for ({'; '.join(diff[:4])})")
    return type(config.encoders)({**config.encoders._sections, arch: theirs})


def _train_subset(corpus: Path, config: Config, names: list[str]) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """-> (the train split's metadata columns, labelled (N,) bool, keep (N,) bool: the labelled
    windows of the finetune.train_fraction patient subset). FinetuneError when train, val or
    test holds no labelled window; SubsetError when the fraction empties a class."""
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


