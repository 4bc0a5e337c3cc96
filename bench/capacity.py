"""Capacity plan at the paper's scale: MIMIC-IV-ECG preprocessing core-hours, corpus bytes, and
pretraining + fine-tuning FLOPs -> GPU-hours on 4x RTX 3090 and 8x H100, per method, for the
mask-rate grid and for the whole study. Arithmetic only: no training, no Ray. Prints JSON.

    python -m bench.capacity                                      # 800,000 records, compiled step: MFU 0.149
    python -m bench.capacity --mode eager                         # the eager step's measured MFU 0.101
    python -m bench.capacity --mfu 0.25                           # another utilisation
    python -m bench.capacity --mfu-rtx3090 0.45 --mfu-h100 0.30   # one per GPU
    python -m bench.capacity --records 400000 --preprocess-rps-per-core 74.0
    python -m bench.capacity --quick                              # studies/tiny.yaml's runs: a smoke run
    python -m bench.capacity --study studies/label_efficiency.yaml --stand-in-data   # a mixture study

A study that builds its corpora from raw records (`source` + `input`, e.g.
studies/label_efficiency.yaml) names them with $VARS, which `load_study` needs set to existing
folders. Set them, or pass --stand-in-data: each one unset (MIMIC_IV_ECG, CODE15, CINC2021, PTBXL,
CPSC2018) is set to its stand-in under --shared (CODE15, which has none, to --shared itself). The
pricing reads none of those folders: only the loader checks that they exist.

What comes from where:
- windows per record, bytes per window: `data.preprocess.*` of --config (the rate, the window,
  the leads), the resampling factors of `coreecg.data.preprocess.resample_factors` and the stored
  dtype `coreecg.data.corpus.SIGNAL_DTYPE`, for records of --record-seconds at --record-rate
  (MIMIC-IV-ECG: 10 s at 500 Hz); the training share of windows from `data.split_ratios`.
- the Parquet overhead over the signal payload: the shard files of an existing corpus
  (--overhead-corpus; default the largest under corpora/), file bytes / (rows x window bytes).
- records/s/core of preprocessing: --preprocess-rps-per-core, measured by `python -m
  bench.preprocess --pipeline` on real PTB-XL 500 Hz records (docs/data_pipeline.md, Throughput).
- every pretraining and fine-tuning run: `coreecg.study.spec.load_study(--study)` (the plan
  `jobs/study.py` runs), each run's config built with the study's own overrides.
- training FLOPs per sample: `bench.common.pretrain_flops_per_sample` (the fine-tuned
  encoder with its `transformer_flops`, on the run's `finetune.leads` x `Config.n_patches` tokens),
  samples per epoch as `coreecg.train.plan.steps_per_epoch` counts full batches.
- a study's pretraining mixture (pretrain.corpora): each corpus priced by its source with the
  records, seconds and rate of PRETRAIN_SOURCES (--records / --record-seconds / --record-rate for
  mimic-iv-ecg, --code15-* and --cinc2021-* for the others); the JSON marks the defaults not given
  on the command line as "assumed". An epoch draws the mixture's train windows once (the default
  weights, docs/mixtures.md). Without pretrain.corpora: --records of MIMIC-IV-ECG, as before.
- downstream corpora: a built one (`path`, studies/paper.yaml) by its name (DOWNSTREAM); one built
  by the study by its source and `data.sources.<source>.*` options (`downstream_kind`): PTB-XL's
  task and label view give its classes and the share of records kept (measured on the shared
  records), split=folds its official folds (8/10, 1/10, 1/10). Either way: records from the
  paper's dataset section (--ptbxl-records etc.); windows per ICBEB2018 record and the share of
  PTB-XL records in the label view from the shared real records (../shared/ecg-data), read with
  the project's own source readers (index files and headers only, no signals).
- evaluation: the pretraining probe (2 x `data.probe_max_windows` encoder forwards per evaluated
  epoch and at init) and fine-tuning validation (`finetune.eval_crops` forwards per val window per
  evaluated epoch, then val + test once more) are counted apart from training.
- linear probes (finetune.mode=linear): with finetune.cache_features (the default) the frozen
  encoder embeds the whole train split (probe_crops=eval; the fraction is drawn from it after) and
  val and test ONCE, `eval_crops` forwards per window (coreecg/train/features.py), then the head
  trains and is scored on features; uncached, every step runs the encoder (`eval_crops` forwards
  per sample with probe_crops=eval, one with random) and every evaluation `eval_crops` per window.
- GPU-hours = FLOPs / (peak dense bf16 tensor FLOP/s x MFU); wall hours = GPU-hours / GPUs (ideal:
  data parallel or one run per GPU, no input bottleneck). Peaks: RTX 3090 71 TFLOP/s (NVIDIA
  Ampere GA102 whitepaper, FP16/BF16 tensor with FP32 accumulate, dense), H100 SXM 989 TFLOP/s
  (NVIDIA H100 datasheet, BF16 tensor, dense).
- MFU (of those datasheet peaks): MEASURED_MFU, the CoRe-ECG step measured on a lent H200 (the
  H100 SXM's compute) by `bash bench/gpu_smoke.sh`, 2026-11-26: achieved FLOP/s / 989 TFLOP/s,
  0.149 compiled (train.compile=true), 0.101 eager (--mode). The RTX 3090 is not measured: it is
  assumed to reach the same fraction of its own peak (MFU_BASIS says why). --mfu sets both GPUs,
  --mfu-rtx3090 / --mfu-h100 one each; the JSON's "mfu" says where each figure came from.
"""
from __future__ import annotations

import math
import sys
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import numpy as np

from bench.common import REPO, SHARED, count_flops, emit, parser, pretrain_flops_per_sample, transformer_flops
from coreecg.config import STANDARD_LEADS, Config, PreprocessConfig, load_config
from coreecg.data.corpus import SIGNAL_DTYPE, load_manifest
from coreecg.data.preprocess import resample_factors
from coreecg.study.plan import ExternalEncoder
from coreecg.train.plan import steps_per_epoch

# Peak dense tensor throughput for bf16 inputs (fp32 accumulate), FLOP/s, and GPUs per node.
PLATFORMS = {
    "4x RTX 3090": {"gpus": 4, "peak_flops_per_gpu": 71e12,
                    "peak_source": "NVIDIA Ampere GA102 GPU architecture whitepaper: RTX 3090 peak "
                                   "FP16/BF16 tensor TFLOPS with FP32 accumulate 71 (142 with sparsity)"},
    "8x H100 SXM": {"gpus": 8, "peak_flops_per_gpu": 989e12,
                    "peak_source": "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM BF16 tensor core "
                                   "1,979 TFLOPS with sparsity, 989 dense"},
}
# Utilisation of the datasheet peaks above, by how the step runs (train.compile): the CoRe-ECG
# pretraining step (paper config, batch 256, bf16, bernoulli STDM) measured 2026-11-26 on a lent
# NVIDIA H200 by `bash bench/gpu_smoke.sh`: 147.4 TFLOP/s compiled, 99.7 eager (51.08 GFLOP/sample,
# pretrain_flops_per_sample), over the H100 SXM's dense 989 (the H200 is the same Hopper chip).
MEASURED_MFU = {"compiled": 0.149, "eager": 0.101}
MFU_BASIS = (
    "measured 2026-11-26 on a lent NVIDIA H200 (torch 2.11.0+cu130), `bash bench/gpu_smoke.sh` "
    "(bench.pretrain_step --device cuda --batch 256 --precisions bf16; paper config, CoRe-ECG, bernoulli "
    "STDM): compiled (train.compile=true) 2,886 samples/s = 147.4 TFLOP/s, eager 1,951 samples/s = 99.7 "
    "TFLOP/s, at 51.08 GFLOP/sample; MFU = achieved / 989 TFLOP/s (H100 SXM dense bf16 datasheet peak; "
    "the H200 has the H100's compute and 4.8 vs 3.35 TB/s memory, so an H100 may be somewhat slower, "
    "most in eager mode, about half of whose step is memory-bound kernels). RTX 3090: not measured; "
    "assumed the same fraction of its own datasheet peak (71 TFLOP/s), conservative since its memory "
    "bandwidth per FLOP (936 GB/s / 71 TFLOP/s) is about 4x Hopper's, so memory-bound kernels weigh less")

# The downstream corpora of studies/paper.yaml: the paper's record counts ("Datasets and
# Preprocessing"), the source that reads them and its options (docs/studies.md builds them so).
DOWNSTREAM = {
    "ptbxl": {"source": "ptbxl", "options": {"label_view": "single"}, "records_arg": "ptbxl_records",
              "record_s": 10.0, "rate": 500},
    "icbeb2018": {"source": "cpsc2018", "options": {"label_view": "first"}, "records_arg": "icbeb_records",
                  "record_s": None, "rate": 500},      # 6-60 s: windows per record from real headers
    "ningbo": {"source": "cinc2021", "options": {"subsets": ["Ningbo"], "class_map": "ningbo25"},
               "records_arg": "ningbo_records", "record_s": 10.0, "rate": 500},
}

# Pretraining corpora by source (a study's pretrain.corpora): records, seconds and rate of one
# record, each overridable by its flag (the arg); `basis` says where the default comes from.
PRETRAIN_SOURCES = {
    "mimic-iv-ecg": {"args": {"records": "records", "seconds": "record_seconds", "rate": "record_rate"},
                     "basis": "paper, 'Datasets and Preprocessing': ~800,000 records of 10 s at 500 Hz"},
    "code15": {"args": {"records": "code15_records", "seconds": "code15_seconds", "rate": "code15_rate"},
               "basis": "docs/data_sources.md: 345,779 exams (Zenodo 4916206) at 400 Hz, 7-10.2 s; "
                        "every exam is one window (7 s exams one padded window: docs/data_pipeline.md "
                        "'Short records'), priced as 10 s"},
    "cinc2021": {"args": {"records": "cinc2021_records", "seconds": "cinc2021_seconds", "rate": "cinc2021_rate"},
                 "basis": "PhysioNet/CinC Challenge 2021 training set: 88,253 records, mostly 10 s at 500 Hz "
                          "(the longer INCART, PTB and CPSC records' extra windows are not counted); the "
                          "downstream val/test records the study excludes (<1 %) are not subtracted"},
}
# Stand-ins for a study's $VARS (--stand-in-data), under --shared; None: --shared itself.
STAND_INS = {"MIMIC_IV_ECG": "mimic-iv-ecg-layout", "CODE15": None, "CINC2021": "cinc2021", "PTBXL": "ptbxl",
             "CPSC2018": "cpsc2018-cinc2020"}


# The published releases' names (studies/foundation_models.yaml's $COREECG_WEIGHTS) -> the fixture
# file of the same format (random weights, reduced sizes: priced at the published size all the same).
STAND_IN_WEIGHTS = {
    "12_lead_ECGFounder.pth": "ecgfounder/12_lead_ECGFounder.pth",
    "1_lead_ECGFounder.pth": "ecgfounder/1_lead_ECGFounder.pth",
    "res18_best_encoder.pth": "merl/res18_best_encoder.pth",
    "vit_tiny_best_encoder.pth": "merl/vit_tiny_best_encoder.pth",
    "best_valid_all_increase_with_augment_epoch_3.pt": "ecgfm_ked/best_valid_all_increase_with_augment_epoch_3.pt",
    "hubert-ecg-base": "hubert_ecg", "xECG_base_model_v1": "xecg",
    "mimic_iv_ecg_physionet_pretrained.pt": "ecg_fm/mimic_iv_ecg_physionet_pretrained.pt",
    "mimic_iv_ecg_finetuned.pt": "ecg_fm/mimic_iv_ecg_finetuned.pt",
    "multiblock_epoch100.pth": "ecg_jepa/multiblock_epoch100.pth", "last_11597276.ckpt": "ecg_cpc/last_11597276.ckpt",
    "config_last_11597276_ckpt.yaml": "ecg_cpc/config_last_11597276_ckpt.yaml",
    "st_mem_vit_base_encoder.pth": "../st-mem/encoder.pth",
}


def stand_in_weights(cfg: Config) -> Path:
    """A temporary $COREECG_WEIGHTS: each release name linked to the fixture file of its format, and
    `coreecg-encoder`, a randomly initialised export of the config's own encoder ($COREECG_ENCODER)."""
    import tempfile

    import torch

    from coreecg.encoders.build import build_encoder

    folder = Path(tempfile.mkdtemp(prefix="coreecg-stand-in-weights-"))
    fixtures = REPO.parent / "shared" / "fixtures" / "published"
    for name, rel in STAND_IN_WEIGHTS.items():
        (folder / name).symlink_to((fixtures / rel).resolve())
    with torch.random.fork_rng(devices=[]):
        build_encoder(cfg).save_pretrained(folder / "coreecg-encoder", config=cfg)
    return folder


def source_options(source: str, overrides: tuple[str, ...] | list[str]) -> dict:
    """The `data.sources.<source>.<option>=value` entries of a corpus's `set`, as reader options."""
    import yaml

    prefix, out = f"data.sources.{source}.", {}
    for o in overrides:
        key, _, value = o.partition("=")
        if key.strip().startswith(prefix):
            out[key.strip()[len(prefix):]] = yaml.safe_load(value)
    return out


def downstream_kind(spec) -> dict:
    """A study's downstream corpus (coreecg.study.spec.CorpusSpec) -> how to price it: DOWNSTREAM's
    entry of its name for a built corpus (`path`), else one made from its source and options."""
    if not spec.source:
        if spec.name not in DOWNSTREAM:
            raise SystemExit(f"bench.capacity: no pricing for the built corpus {spec.name!r} "
                             f"(known: {', '.join(DOWNSTREAM)}); give it as source + input")
        return {**DOWNSTREAM[spec.name], "split": None}
    opts = source_options(spec.source, spec.set)
    if spec.source == "ptbxl":
        split = opts.pop("split", "patients")
        return {"source": "ptbxl", "options": {"label_view": "single", "task": "superdiagnostic", **opts},
                "records_arg": "ptbxl_records",
                "record_s": 10.0, "rate": 500,
                "split": "official folds: strat_fold 1-8 / 9 / 10" if split == "folds" else None}
    if spec.source == "cpsc2018":
        return {"source": "cpsc2018", "options": {"label_view": "first", **opts}, "records_arg": "icbeb_records",
                "record_s": None, "rate": 500, "split": None}
    if spec.source == "cinc2021" and opts.get("subsets") == ["Ningbo"]:
        return {**DOWNSTREAM["ningbo"], "options": {**DOWNSTREAM["ningbo"]["options"], **opts}, "split": None}
    raise SystemExit(f"bench.capacity: no pricing for downstream corpus {spec.name!r} (source {spec.source}, "
                     f"options {opts}): known sources ptbxl, cpsc2018, cinc2021 with subsets [Ningbo]")


def windows_per_record(seconds: float, rate: float, pp: PreprocessConfig) -> int:
    """Stored windows of one record: resampled with the exact rational factors (resample_poly's
    output is ceil(n * up / down) samples), cut into consecutive windows, remainder dropped;
    shorter than min_duration_s -> quarantined (0)."""
    n = int(round(seconds * rate))
    if n < pp.min_duration_s * rate:
        return 0
    up, down = resample_factors(rate, pp.sampling_rate, pp.resample_max_denominator)
    return math.ceil(n * up / down) // pp.window_samples


def window_bytes(pp: PreprocessConfig) -> int:
    return len(pp.leads) * pp.window_samples * np.dtype(SIGNAL_DTYPE).itemsize


def parquet_overhead(corpus: Path | None) -> dict:
    """Shard bytes on disk over their signal payload (rows x window bytes), plus the manifest and
    quarantine files, measured on an existing corpus."""
    if corpus is None:
        return {"factor": 1.0, "corpus": None, "note": "no corpus found: payload only"}
    man = load_manifest(corpus)
    per_window = int(np.prod(man["signal"]["shape"])) * np.dtype(man["signal"]["dtype"]).itemsize
    rows = sum(s["rows"] for s in man["shards"])
    shard_bytes = sum((corpus / s["path"]).stat().st_size for s in man["shards"])
    side = sum((corpus / f).stat().st_size for f in ("manifest.json", "quarantine.csv") if (corpus / f).is_file())
    return {"corpus": str(corpus), "rows": rows, "shards": len(man["shards"]), "window_bytes": per_window,
            "shard_bytes": shard_bytes, "side_file_bytes": side,
            "bytes_per_row": round(shard_bytes / rows, 1),
            "factor": round((shard_bytes + side) / (rows * per_window), 5)}


def default_overhead_corpus() -> Path | None:
    found = []
    for m in (REPO / "corpora").glob("*/manifest.json"):
        try:
            found.append((sum(s["rows"] for s in load_manifest(m.parent)["shards"]), m.parent))
        except (OSError, ValueError, KeyError):
            continue
    return max(found)[1] if found else None


def icbeb_windows_per_record(pp: PreprocessConfig, root: Path) -> dict:
    """Mean stored windows per CPSC2018 record over the shared real records' headers."""
    counts = []
    for hea in sorted(root.glob("*.hea")):
        fields = hea.read_text().split("\n", 1)[0].split()
        fs, n = float(fields[2]), int(fields[3])
        counts.append(windows_per_record(n / fs, fs, pp))
    if not counts:
        raise FileNotFoundError(f"no .hea files under {root}")
    return {"records": len(counts), "windows": sum(counts), "quarantined_under_min_duration": counts.count(0),
            "mean": sum(counts) / len(counts), "source": str(root)}


def ptbxl_single_label_share(root: Path, **options) -> dict:
    """Share of PTB-XL records a label view keeps (default: the single-label one, superdiagnostic),
    over the shared database csv rows."""
    from coreecg.data.record import RecordError
    from coreecg.data.sources import get_source

    src = get_source("ptbxl", **{"label_view": "single", **options})
    refs = src.list_records(root)
    kept = 0
    for ref in refs:
        try:
            src.labels_for(ref)
            kept += 1
        except RecordError:
            pass
    return {"records": len(refs), "kept": kept, "share": kept / len(refs), "source": str(root / "ptbxl_database.csv")}


def ningbo_label_share(root: Path) -> dict:
    """Share of the shared Ningbo records (CinC 2021 JS*) the 25-class task keeps, and their
    windows per record: read with the cinc2021 reader (a record without a task label is refused)."""
    from coreecg.data.record import RecordError
    from coreecg.data.sources import get_source

    spec = DOWNSTREAM["ningbo"]
    src = get_source(spec["source"], **spec["options"])
    refs = src.list_records(root)
    kept, seconds = 0, []
    for ref in refs:
        try:
            rec = src.read(ref)
        except RecordError:
            continue
        kept += 1
        seconds.append(rec.signal.shape[-1] / rec.fs)
    return {"records": len(refs), "kept": kept, "share": kept / len(refs),
            "seconds_min_max": [min(seconds), max(seconds)] if seconds else None, "source": str(root)}


def in_repo(path: str) -> str:
    """A path relative to the repository when inside it, else absolute."""
    path_ = Path(path).resolve()
    return str(path_.relative_to(REPO)) if path_.is_relative_to(REPO) else str(path_)


def sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def n_classes(kind: dict) -> int:
    from coreecg.data.sources import get_source

    return len(get_source(kind["source"], **kind["options"]).class_names)


def encoder_forward(cfg: Config, n_leads: int, n_out: int = 0) -> float:
    """The fine-tuned encoder on `n_leads` x Config.n_patches tokens, forward, as
    `pretrain_flops_per_sample` counts the pretraining encoder (patch embedding + blocks), plus a
    linear head of `n_out`; another encoder than the paper's ViT: torch's count."""
    if cfg.model.arch != "coreecg":                    # another encoder: torch's count of its forward
        return measured_encoder_forward(cfg) + 2 * measured_encoder_width(cfg) * n_out
    m = cfg.encoders.coreecg                           # the ViT's sizes
    tokens = n_leads * cfg.n_patches
    return 2 * tokens * m.patch_size * m.embed_dim + transformer_flops(tokens, m.embed_dim, m.depth, m.mlp_ratio) \
        + 2 * m.embed_dim * n_out


_ENCODERS: dict[str, tuple[float, int, int]] = {}


def _measured_encoder(cfg: Config) -> tuple[float, int, int]:
    """(forward FLOPs per window, width, parameters) of cfg's encoder, torch's count on the CPU (a sequence
    encoder reads every lead channel whatever the subset: its cost does not change with it)."""
    import torch

    from coreecg.encoders import build_encoder

    key = repr((cfg.model, cfg.encoder, cfg.plugins))
    if key not in _ENCODERS:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            encoder = build_encoder(cfg).eval()
            x = torch.randn(2, cfg.model.n_leads, cfg.model.input_samples)
            # a published family's own layout (xECG time-major, HuBERT-ECG flat) and rows
            from coreecg.model.published.registry import model_layout

            _ENCODERS[key] = (count_flops(encoder.pooled, *model_layout(encoder, x))["total"] / 2, int(encoder.dim),
                              sum(p.numel() for p in encoder.parameters()))
    return _ENCODERS[key]


def measured_encoder_forward(cfg: Config) -> float:
    return _measured_encoder(cfg)[0]


def measured_encoder_parameters(cfg: Config) -> int:
    return _measured_encoder(cfg)[2]


def measured_encoder_width(cfg: Config) -> int:
    return _measured_encoder(cfg)[1]


@lru_cache(maxsize=None)
def _source_config(path: str) -> Config:
    """A given encoder's config, its file read once (a study prices it for each of its runs)."""
    from coreecg.loading import open_source

    return open_source(path, kind="encoder").config


def external_run_config(rc: Config, path: str, published_size: bool) -> tuple[Config, int]:
    """A fine-tuning run's config with its given encoder's architecture (coreecg.loading.open_source),
    a published family's input contract (its leads, window, one evaluation crop) and -> the contract's
    windows per 10 s window of the downstream corpus (ECG-FM: two 5 s windows). `published_size`
    (--stand-in-data): a published file is priced at its release's published size (the family's options
    defaults; MERL's ViT-tiny by its name), whatever size the stand-in file holds."""
    import dataclasses

    from coreecg.model.published import FAMILIES, contract_of
    from coreecg.model.published.registry import published_config

    src = _source_config(path)
    arch = src.model.arch
    if published_size and arch in FAMILIES:
        src = dataclasses.replace(src, **published_config(arch, Path(path).name, src.model.n_leads))
    sections = type(rc.encoders)({**rc.encoders._sections, **{arch: getattr(src.encoders, arch)}}) \
        if arch in src.encoders.names(arch) else rc.encoders
    pre = src.data.preprocess
    ft = rc.finetune
    per_window = 1
    if pre.contract:
        contract = contract_of(FAMILIES[arch], len(pre.leads))
        noise = np.random.default_rng(0).normal(size=(12, 5000))       # a 10 s record at 500 Hz
        per_window = int(contract.windows(noise, 500, STANDARD_LEADS).shape[0])
        ft = dataclasses.replace(ft, leads=tuple(pre.leads), eval_crops=1)
    data = dataclasses.replace(rc.data, crop_samples=src.model.input_samples,
                               **({"preprocess": pre} if pre.contract else {}))
    return dataclasses.replace(rc, model=src.model, encoders=sections, data=data, finetune=ft), per_window


def samples_per_epoch(n_windows: int, batch: int) -> int:
    return steps_per_epoch(None, n_windows, batch, 1, "batch_size") * batch


def no_full_batch(rc: Config, ds: dict) -> bool:
    """True when the run's training windows do not fill one batch of finetune.batch_size
    (coreecg.train.plan.steps_per_epoch refuses such a run)."""
    return int(ds["train"] * rc.finetune.train_fraction) < rc.finetune.batch_size


def finetune_cost(rc: Config, ds: dict) -> tuple[float, float]:
    """(training FLOPs, evaluation FLOPs) of one fine-tuning run of config `rc` on the downstream
    corpus `ds` (an entry of the JSON's "downstream")."""
    ft = rc.finetune
    fwd = encoder_forward(rc, len(ft.leads), ds["classes"])
    train_windows = int(ds["train"] * ft.train_fraction)
    # fewer windows than one batch: the run itself stops with a PlanError (no_full_batch); priced
    # as if it took them all as one step per epoch
    spe = train_windows if no_full_batch(rc, ds) else samples_per_epoch(train_windows, ft.batch_size)
    width = rc.encoders.coreecg.embed_dim if rc.model.arch == "coreecg" else measured_encoder_width(rc)
    head_only = 2 * width * ds["classes"]
    every = rc.train.eval_every_epochs or ft.epochs
    evals = sum(1 for e in range(1, ft.epochs + 1) if e % every == 0 or e == ft.epochs)
    if ft.mode == "linear" and ft.cache_features:
        # one embedding pass (coreecg/train/features.py): val, test and, with probe_crops=eval, the
        # whole train split (the fraction's windows are drawn from it), eval_crops forwards each;
        # then the head alone (forward + weight gradient) on the features, scored on them
        on_features = ft.probe_crops == "eval"
        embed = (ds["train"] if on_features else 0) * ft.eval_crops * fwd
        per_sample = 2 * head_only if on_features else fwd + 2 * head_only
        train = embed + per_sample * spe * ft.epochs
        ev = (ds["val"] + ds["test"]) * ft.eval_crops * fwd + (evals * ds["val"] + ds["val"] + ds["test"]) * head_only
        return train, ev
    if ft.mode == "linear" and ft.probe_crops == "eval":    # uncached: the crops' features every step
        per_sample = ft.eval_crops * fwd + 2 * head_only
    elif ft.mode in ("linear", "frozen"):
        # frozen encoder: its forward only; the attention-pooling head is small beside it
        per_sample = fwd + 2 * head_only
    else:
        per_sample = 3 * fwd
    ev = (evals * ds["val"] + ds["val"] + ds["test"]) * ft.eval_crops * fwd
    return per_sample * spe * ft.epochs, ev


def pretrain_mixture(study, args, pp: PreprocessConfig, train_share: float, given: set[str]) -> list[dict]:
    """Each pretraining corpus of the study priced by its source (PRETRAIN_SOURCES)."""
    out = []
    for c in study.pretrain_corpora:
        if c.source not in PRETRAIN_SOURCES:
            raise SystemExit(f"bench.capacity: no pricing for pretraining corpus {c.name!r} "
                             f"(source {c.source or c.path}); "
                             f"known sources: {', '.join(PRETRAIN_SOURCES)}")
        src = PRETRAIN_SOURCES[c.source]
        vals = {k: getattr(args, a) for k, a in src["args"].items()}
        wpr = windows_per_record(vals["seconds"], vals["rate"], pp)
        windows = vals["records"] * wpr
        out.append({"corpus": c.name, "source": c.source, "records": vals["records"],
                    "record": f"{vals['seconds']:g} s at {vals['rate']:g} Hz", "windows_per_record": wpr,
                    "windows": windows, "train_windows": round(windows * train_share),
                    "payload_bytes": windows * window_bytes(pp),
                    "raw_wfdb_payload_bytes": round(vals["records"] * len(pp.leads) * vals["seconds"]
                                                    * vals["rate"] * 2),
                    "assumed": [f"--{a.replace('_', '-')}" for a in src["args"].values() if a not in given],
                    "basis": src["basis"]})
    return out


def gpu_hours(flops: float, mfu: dict[str, float]) -> dict:
    out = {}
    for name, p in PLATFORMS.items():
        gh = flops / (p["peak_flops_per_gpu"] * mfu[name]) / 3600
        out[name] = {"gpu_hours": sig(gh, 3), "wall_hours": sig(gh / p["gpus"], 3)}
    return out


def main() -> None:
    p = parser(__doc__, "the runs of studies/tiny.yaml instead of studies/paper.yaml")
    p.add_argument("--config", default=str(REPO / "configs" / "paper.yaml"))
    p.add_argument("--study", default=str(REPO / "studies" / "paper.yaml"))
    p.add_argument("--records", type=int, default=800_000, help="MIMIC-IV-ECG records (paper: ~800,000)")
    p.add_argument("--record-seconds", type=float, default=10.0, help="MIMIC-IV-ECG: 10 s records")
    p.add_argument("--record-rate", type=float, default=500.0, help="MIMIC-IV-ECG: 500 Hz")
    p.add_argument("--preprocess-rps-per-core", type=float, default=64.6,
                   help="records/s on one core (python -m bench.preprocess --pipeline, real PTB-XL 500 Hz "
                        "records: docs/data_pipeline.md, Throughput)")
    p.add_argument("--preprocess-cores", type=int, default=16, help="cores of a preprocessing node (wall hours)")
    p.add_argument("--overhead-corpus", default=None,
                   help="an existing corpus to measure the Parquet overhead on (default: largest under corpora/)")
    p.add_argument("--mode", choices=sorted(MEASURED_MFU), default="compiled",
                   help="which measured utilisation prices the runs (MEASURED_MFU): the compiled step "
                        "(train.compile=true) 0.149, eager 0.101 of the dense bf16 datasheet peak")
    p.add_argument("--mfu", type=float, default=None,
                   help="model FLOPs utilisation of the bf16 dense peak, both GPUs (default: --mode's measured)")
    p.add_argument("--mfu-rtx3090", type=float, default=None, help="default: --mfu, else --mode's measured")
    p.add_argument("--mfu-h100", type=float, default=None, help="default: --mfu, else --mode's measured")
    p.add_argument("--ptbxl-records", type=int, default=21_837, help="paper: 21,837")
    p.add_argument("--icbeb-records", type=int, default=6_877, help="paper: 'over 6,000'; CPSC2018: 6,877")
    p.add_argument("--ningbo-records", type=int, default=34_905, help="paper: 34,905")
    p.add_argument("--shared", default=str(SHARED), help="the shared real records (ICBEB durations, PTB-XL labels)")
    p.add_argument("--code15-records", type=int, default=345_779, help="CODE-15%% exams (Zenodo 4916206: 345,779)")
    p.add_argument("--code15-seconds", type=float, default=10.0, help="CODE-15%%: 7-10.2 s, one window each")
    p.add_argument("--code15-rate", type=float, default=400.0, help="CODE-15%%: 400 Hz")
    p.add_argument("--cinc2021-records", type=int, default=88_253, help="PhysioNet/CinC 2021 training records: 88,253")
    p.add_argument("--cinc2021-seconds", type=float, default=10.0, help="CinC 2021: mostly 10 s")
    p.add_argument("--cinc2021-rate", type=float, default=500.0, help="CinC 2021: mostly 500 Hz")
    p.add_argument("--stand-in-data", action="store_true",
                   help="set each unset $VAR of the study's raw data folders (" + ", ".join(STAND_INS)
                        + ") to its stand-in under --shared: the loader checks they exist, the pricing reads none")
    args = p.parse_args()
    if args.quick:
        args.study = str(REPO / "studies" / "tiny.yaml")
    argv = sys.argv[1:]
    given = {a.dest for a in p._actions
             if any(x == o or x.startswith(o + "=") for o in a.option_strings for x in argv)}
    if args.stand_in_data:
        import os

        for var, sub in STAND_INS.items():
            os.environ.setdefault(var, str(Path(args.shared) / sub if sub else Path(args.shared)))
        if "COREECG_WEIGHTS" not in os.environ or "COREECG_ENCODER" not in os.environ:
            folder = stand_in_weights(load_config(args.config))
            os.environ.setdefault("COREECG_WEIGHTS", str(folder))
            os.environ.setdefault("COREECG_ENCODER", str(folder / "coreecg-encoder"))

    for v in (args.mfu, args.mfu_rtx3090, args.mfu_h100):
        if v is not None and not 0 < v <= 1:
            p.error(f"an MFU must lie in (0, 1], got {v}")
    mfu, mfu_from = {}, {}
    for name, own, flag, how in (
            ("4x RTX 3090", args.mfu_rtx3090, "--mfu-rtx3090",
             f"assumed: the H100's measured {args.mode} fraction of the datasheet peak (MFU_BASIS)"),
            ("8x H100 SXM", args.mfu_h100, "--mfu-h100",
             f"measured, {args.mode} step, H200 (the H100's compute; MFU_BASIS)")):
        if own is not None:
            mfu[name], mfu_from[name] = own, flag
        elif args.mfu is not None:
            mfu[name], mfu_from[name] = args.mfu, "--mfu"
        else:
            mfu[name], mfu_from[name] = MEASURED_MFU[args.mode], how
    cfg = load_config(args.config)
    pp, d = cfg.data.preprocess, cfg.data
    train_share, val_share, test_share = d.split_ratios

    from coreecg.study.spec import load_study

    study = load_study(args.study)
    mixture = pretrain_mixture(study, args, pp, train_share, given) if study.pretrain_corpora else None

    # ---------------------------------------------------------------- preprocessing and corpus
    overhead = parquet_overhead(Path(args.overhead_corpus) if args.overhead_corpus else default_overhead_corpus())
    wbytes = window_bytes(pp)
    window = {"leads": len(pp.leads), "samples": pp.window_samples, "sampling_rate": pp.sampling_rate,
              "dtype": np.dtype(SIGNAL_DTYPE).name, "bytes": wbytes}
    records = sum(c["records"] for c in mixture) if mixture else args.records
    core_s = records / args.preprocess_rps_per_core
    preprocessing = {
        "records": records, "records_per_s_per_core": args.preprocess_rps_per_core,
        "core_hours": sig(core_s / 3600, 3),
        f"wall_hours_on_{args.preprocess_cores}_cores_ideal": sig(core_s / 3600 / args.preprocess_cores, 3),
    }
    if mixture:
        for c in mixture:
            c["corpus_bytes"] = round(c["payload_bytes"] * overhead["factor"])
        payload = sum(c["payload_bytes"] for c in mixture)
        corpus = {"mixture": mixture, "window": window, "windows": sum(c["windows"] for c in mixture),
                  "payload_bytes": payload, "overhead": overhead, "corpus_bytes": round(payload * overhead["factor"]),
                  "train_windows": sum(c["train_windows"] for c in mixture),
                  "raw_wfdb_payload_bytes": sum(c["raw_wfdb_payload_bytes"] for c in mixture),
                  "epoch": "the mixture's train windows, each once (default weights: docs/mixtures.md)"}
        pretrain_train = corpus["train_windows"]
    else:
        wpr = windows_per_record(args.record_seconds, args.record_rate, pp)
        windows = args.records * wpr
        payload = windows * wbytes
        corpus = {
            "record": f"{args.record_seconds:g} s at {args.record_rate:g} Hz",
            "windows_per_record": wpr, "windows": windows, "window": window,
            "payload_bytes": payload, "overhead": overhead,
            "corpus_bytes": round(payload * overhead["factor"]),
            "train_windows": round(windows * train_share),
            "raw_wfdb_payload_bytes": round(args.records * len(pp.leads) * args.record_seconds * args.record_rate * 2),
        }
        pretrain_train = round(windows * train_share)

    # ---------------------------------------------------------------- downstream corpora
    shared = Path(args.shared)
    kinds = {c.name: downstream_kind(c) for c in study.corpora}
    measured: dict[str, dict] = {}      # what the shared records say, once per reader and options

    def keep_share(kind: dict) -> float:
        if kind["source"] == "cinc2021":
            if "ningbo25_label_share" not in measured:
                measured["ningbo25_label_share"] = ningbo_label_share(shared / "cinc2021")
            return measured["ningbo25_label_share"]["share"]
        if kind["source"] == "ptbxl":
            opts = kind["options"]
            named = {k: v for k, v in opts.items() if (k, v) != ("task", "superdiagnostic")}
            key = "ptbxl_" + "_".join(f"{v}" for v in named.values()) + "_label_share"
            if key not in measured:
                measured[key] = ptbxl_single_label_share(shared / "ptbxl", **opts)
            return measured[key]["share"]
        return 1.0

    downstream = {}
    for name, kind in kinds.items():
        if kind["record_s"] is None and "icbeb2018_windows_per_record" not in measured:
            measured["icbeb2018_windows_per_record"] = icbeb_windows_per_record(pp, shared / "cpsc2018-cinc2020")
        records_n = getattr(args, kind["records_arg"])
        per = (measured["icbeb2018_windows_per_record"]["mean"] if kind["record_s"] is None
               else windows_per_record(kind["record_s"], kind["rate"], pp))
        keep = keep_share(kind)
        total_w = records_n * keep * per
        # the official PTB-XL folds hold 8/10, 1/10, 1/10 of the records; else data.split_ratios
        shares = (0.8, 0.1, 0.1) if kind["split"] else (train_share, val_share, test_share)
        downstream[name] = {"records": records_n, "windows_per_record": round(per, 4),
                            "label_view_share": round(keep, 4),
                            "windows": round(total_w), "train": round(total_w * shares[0]),
                            "val": round(total_w * shares[1]), "test": round(total_w * shares[2]),
                            "classes": n_classes(kind)}
        if next(c for c in study.corpora if c.name == name).source:      # built by the study: say how
            downstream[name].update({"source": kind["source"], "options": kind["options"],
                                     "split": kind["split"] or "data.split_ratios (by patient)"})
    order = ["icbeb2018_windows_per_record", "ptbxl_single_label_share"]
    measured = dict(sorted(measured.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else
                                                             1.5 if kv[0].startswith("ptbxl") else 2, kv[0])))

    # ---------------------------------------------------------------- the study's runs
    pre_rows, pre_flops, probe_flops = [], {}, {}
    compiles: set[bool] = set()         # do the study's pretrainings run compiled on a GPU? (auto: yes)
    for run in study.pretrain_runs():
        rc = load_config(study.config_file, study.pretrain_overrides(run, study.planned_pretrain_corpora()))
        compiles.add(rc.train.compile in (True, "auto"))
        f = pretrain_flops_per_sample(rc)
        spe = samples_per_epoch(pretrain_train, rc.optim.batch_size)
        samples = spe * rc.optim.epochs
        every = rc.train.eval_every_epochs
        evals = (sum(1 for e in range(1, rc.optim.epochs + 1) if e % every == 0 or e == rc.optim.epochs) + 1
                 if every else 0)          # + the probe at init
        probe = evals * 2 * rc.data.probe_max_windows * encoder_forward(rc, rc.model.n_leads)
        pre_flops[run.name], probe_flops[run.name] = f["train_step"] * samples, probe
        pre_rows.append({"run": run.name, "variant": run.variant, "cell": run.cell or None,
                         "method": rc.pretrain.method, "train_gflop_per_sample": round(f["train_step"] / 1e9, 2),
                         "samples_per_epoch": spe, "epochs": rc.optim.epochs, "samples": samples,
                         "train_flops": sig(f["train_step"] * samples), "probe_flops": sig(probe),
                         **gpu_hours(f["train_step"] * samples, mfu)})

    ft_rows, ft_flops, ft_eval = [], {}, {}
    features: dict[tuple, str] = {}
    short: dict[tuple, tuple[int, int]] = {}      # (corpus, fraction) -> (train windows, batch) < one batch
    grouped: dict[tuple, list] = defaultdict(list)
    mask_names = {r.name for r in study.mask_rate_runs()}
    given: dict[str, dict] = {}                  # a given encoder's size and forward cost per 10 s record
    for run in [*study.finetune_runs(), *study.mask_rate_runs()]:
        rc = load_config(study.config_file, study.finetune_overrides(run))
        ds = downstream[run.corpus]
        if isinstance(run.encoder, ExternalEncoder):      # a given encoder: its own architecture and contract
            rc, per_window = external_run_config(rc, run.encoder.path, args.stand_in_data)
            ds = {**ds, **{k: ds[k] * per_window for k in ("train", "val", "test")}}
            if run.method not in given:
                given[run.method] = {"arch": rc.model.arch, "parameters": measured_encoder_parameters(rc),
                                     "windows_per_record": per_window,
                                     "gflop_per_record": sig(per_window * measured_encoder_forward(rc) / 1e9),
                                     "window": [rc.model.n_leads, rc.model.input_samples]}
        ft = rc.finetune
        ft_flops[run.name], ft_eval[run.name] = finetune_cost(rc, ds)
        if no_full_batch(rc, ds):
            short[(run.corpus, ft.train_fraction)] = (int(ds["train"] * ft.train_fraction), ft.batch_size)
        if ft.mode == "linear":
            features[(run.corpus, ft.train_fraction)] = ("cached: one embedding pass, then the head on features"
                                                         if ft.cache_features else "uncached: the encoder every step")
        key = ("mask_rates" if run.name in mask_names else "tables", run.corpus, ft.mode, len(ft.leads),
               ft.train_fraction)
        grouped[key].append(run.name)
    for (part, corpus_name, mode, leads, fraction), names in grouped.items():
        one = ft_flops[names[0]]
        ft_rows.append({"part": part, "corpus": corpus_name, "mode": mode, "leads": leads, "train_fraction": fraction,
                        "runs": len(names), "train_flops_per_run": sig(one),
                        "eval_flops_per_run": sig(ft_eval[names[0]]),
                        "train_flops": sig(sum(ft_flops[n] for n in names)),
                        **gpu_hours(sum(ft_flops[n] for n in names), mfu),
                        "per_run_with_eval": gpu_hours(one + ft_eval[names[0]], mfu),
                        **({"features": features[(corpus_name, fraction)]} if mode == "linear" else {})})

    def total(pre: list[str], fine: list[str], with_eval: bool = True) -> dict:
        train = sum(pre_flops[n] for n in pre) + sum(ft_flops[n] for n in fine)
        ev = sum(probe_flops[n] for n in pre) + sum(ft_eval[n] for n in fine)
        flops = train + (ev if with_eval else 0)
        return {"pretrainings": len(pre), "finetunings": len(fine), "train_flops": sig(train), "eval_flops": sig(ev),
                "flops": sig(flops), **gpu_hours(flops, mfu)}

    grid_pre = [r.name for r in study.mask_rates.runs()] if study.mask_rates else []
    grid_ft = sorted(mask_names)
    table_pre = [r.name for r in study.pretrain_runs() if r.name not in set(grid_pre)]
    table_ft = [r.name for r in study.finetune_runs()]
    by_cost: dict[float, list] = defaultdict(list)
    for r in pre_rows:
        if r["cell"] is not None:
            by_cost[r["train_gflop_per_sample"]].append(r)
    cells = [{"cells": [r["cell"] for r in rs], "train_gflop_per_sample": g,
              "per_cell": {k: rs[0][k] for k in PLATFORMS}} for g, rs in by_cost.items()]
    core = next((r for r in pre_rows if r["variant"] == "CoRe-ECG" and r["cell"] is None), None)
    ingest = {name: round(p["gpus"] * p["peak_flops_per_gpu"] * mfu[name] / (core["train_gflop_per_sample"] * 1e9))
              for name, p in PLATFORMS.items()} if core else None

    mfu_info = {"mode": args.mode, "measured": MEASURED_MFU, "basis": MFU_BASIS, "by_platform": mfu_from,
                "study_train_compile": sorted(compiles)}
    if args.mode == "compiled" and False in compiles and any(not f.startswith("--") for f in mfu_from.values()):
        mfu_info["note"] = ("priced as compiled steps, but the study's pretrainings set train.compile=false: "
                            "as configured they run eager (--mode eager) unless given --set train.compile=auto")

    out = {
        "benchmark": "capacity", "command": " ".join(["python -m bench.capacity", *sys.argv[1:]]),
        "config": in_repo(args.config),
        "study": in_repo(args.study),
        "mfu": mfu_info,
        "platforms": {n: {**p, "mfu": mfu[n], "mfu_from": mfu_from[n],
                          "effective_flops_per_gpu": p["peak_flops_per_gpu"] * mfu[n]}
                      for n, p in PLATFORMS.items()},
        "preprocessing": preprocessing,
        "corpus": corpus,
        "downstream": downstream,
        "downstream_measured_on_shared_records": measured,
        "pretraining": [r for r in pre_rows if r["cell"] is None],
        "mask_rate_cells": cells,
        "finetuning": ft_rows,
        **({"given_encoders": given} if given else {}),
        "core_ecg_ingest_windows_per_s_needed": ingest,
        **({"plan_errors": [f"{c} at train_fraction {f:g}: ~{n} training windows, no full batch of {b} "
                            f"(finetune.batch_size): the run would stop with a PlanError; priced as one step "
                            f"of all {n} per epoch" for (c, f), (n, b) in short.items()]} if short else {}),
        "totals": {
            "tables_pretraining": total(table_pre, []),
            "tables_finetuning": total([], table_ft),
            "mask_rate_grid": total(grid_pre, grid_ft),
            "study": total([*table_pre, *grid_pre], [*table_ft, *grid_ft]),
            "study_without_eval": total([*table_pre, *grid_pre], [*table_ft, *grid_ft], with_eval=False),
        },
    }
    emit(out)


if __name__ == "__main__":
    main()
