"""Does each pretraining method learn at all on real records? A fixed budget per method on the
shared real ECGs, then the in-loop linear probe against the randomly initialised encoder.

    python -m experiments.methods_probe                             # quickstart model, 30 epochs, ~10 min
    python -m experiments.methods_probe --methods core,moco_v3 --epochs 10 --set optim.lr=5e-4

Pretraining windows: the PTB-XL train split, all of CPSC2018 (CinC 2020 release) and the CinC
2021 records of ../shared/ecg-data (labels unused). Probe: PTB-XL's 5 diagnostic superclasses,
fitted on every PTB-XL train window (the few-label probe is noise at this size) and scored on the
validation and test splits together (macro AUROC; 43 windows), patients disjoint from the
pretraining windows of PTB-XL.
CMSC gets each window's recording id (windows of one recording are never its negatives).
Every method starts from the same encoder weights (same seed; the encoder is built first), so
`probe_auroc_init` is shared. The plain loop (`pretrain_local`), the same one as on Ray.

Prints one JSON object: per method the probe at init, after each eval epoch and at the end, the
first and last epoch loss, steps and seconds. These are tiny data: the figures show that a
method learns, not how well it would do at scale.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import REPO, SHARED as DATA
from coreecg.config import load_config

CORPORA = {"ptbxl": "ptbxl", "cpsc2018": "cpsc2018-cinc2020", "cinc2021": "cinc2021"}
SPLITS = ("train", "val", "test")


def build(cache: Path) -> dict[str, Path]:
    import ray

    from coreecg.data.pipeline import build_corpus

    from coreecg.cluster import init_ray

    cfg = load_config(overrides=["data.shard_records=64"]).data
    init_ray()
    try:
        for name, folder in CORPORA.items():
            build_corpus(name, DATA / folder, cache / name, cfg, source_options=cfg.sources.for_source(name, 0),
                         log_warnings=False)
    finally:
        ray.shutdown()
    return {name: cache / name for name in CORPORA}


def epoch_records(run_dir: Path) -> tuple[float, list[dict]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    init = next(x["probe_auroc"] for x in lines if x.get("event") == "probe_init")
    return init, [x for x in lines if x.get("kind") == "epoch"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="core,moco_v3,cmsc")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    p.add_argument("--cache", default=None, help="where the corpora are built (default: a temp folder)")
    p.add_argument("--set", action="append", default=[], metavar="A.B=C")
    args = p.parse_args()

    from coreecg.data.corpus import load_manifest
    from coreecg.data.reading import read_split
    from coreecg.eval.probe import ProbeSplit, load_probe_data
    from coreecg.train.pretraining import pretrain_local

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.cache) if args.cache else Path(tmp) / "corpora"
        corpora = build(cache)
        parts, patients = [], []
        for name, splits in (("ptbxl", ("train",)), ("cpsc2018", SPLITS), ("cinc2021", SPLITS)):
            present = {s["split"] for s in load_manifest(corpora[name])["shards"]}
            for split in (s for s in splits if s in present):
                parts.append(read_split(corpora[name], split, ["signal"])["signal"])
                # same order
                patients += [f"{name}/{p}" for p in read_split(corpora[name], split, ["patient_id"])["patient_id"]]
        windows = np.concatenate(parts).astype(np.float32)
        patient_of = np.unique(patients, return_inverse=True)[1]     # CMSC: one patient's windows share an id
        probe = load_probe_data(corpora["ptbxl"], 1000)
        test = read_split(corpora["ptbxl"], "test", ["signal", "labels"])
        probe.val = ProbeSplit(np.concatenate([probe.val.windows, test["signal"]]),
                               np.concatenate([probe.val.multihot, test["multihot"]]),
                               np.concatenate([probe.val.label, test["label"]]))
        results = {}
        for method in args.methods.split(","):
            cfg = load_config(args.config, [f"pretrain.method={method}", f"optim.epochs={args.epochs}",
                                            f"train.eval_every_epochs={max(1, args.epochs // 3)}",
                                            "train.figures=false", "train.checkpoint_every_steps=0",
                                            "data.probe_labels_per_class=0", *args.set])
            run_dir = Path(tmp) / "runs" / method
            t0 = time.perf_counter()
            last = pretrain_local(cfg, windows, run_dir, probe, patient_of=patient_of)
            seconds = time.perf_counter() - t0
            init, epochs = epoch_records(run_dir)
            probes = [round(e["probe_auroc"], 4) for e in epochs if "probe_auroc" in e]
            results[method] = {
                "label": cfg.method_label, "probe_auroc_init": round(init, 4), "probe_auroc_final": probes[-1],
                "probe_auroc_gain": round(probes[-1] - init, 4), "probe_auroc_at_eval_epochs": probes,
                "loss_first_epoch": round(epochs[0]["loss"], 4), "loss_last_epoch": round(last["loss"], 4),
                "steps": int(last["step"]), "seconds": round(seconds, 1),
            }
            print(json.dumps({method: results[method]}), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "methods_probe", "config": args.config, "epochs": args.epochs,
                      "overrides": args.set, "pretraining_windows": int(len(windows)),
                      "pretraining_patients": int(patient_of.max() + 1),
                      "probe": {"corpus": "ptbxl", "classes": probe.class_names,
                                "train_windows": int(len(probe.train.label)), "val_windows": int(len(probe.val.label))},
                      "threads": torch.get_num_threads(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
