"""Which decoder attention layout learns: joint, per lead, axial (docs/decisions.md).

    python -m experiments.decoder_layout                    # quickstart model, both datasets, CoRe + rec-only
    python -m experiments.decoder_layout --layouts axial,lead --objectives core --data synthetic

For each layout of the Time Decoder (`methods.core.time_decoder.layout`; `--decoder latent`: the Latent
Decoder's) and each objective, runs the
shared training loop (`pretrain_local`, one process: the numerics of `jobs/pretrain.py`
without Ray) on
  synthetic: the default run's corpus (configs/quickstart.yaml: the embedded synthetic corpus),
  real:      the shared real records (PTB-XL + the MIMIC-IV-ECG-layout folder, preprocessed here),
and prints one JSON object: loss_rec per epoch, first and last, and the probe (synthetic only,
its own labels) at the end. Predict-the-mean gives loss_rec = 1 on z-scored windows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import REPO, SHARED
from coreecg.config import load_config


def real_windows(shared: Path, cache: Path) -> np.ndarray:
    import ray

    from coreecg.cluster import init_ray
    from coreecg.data.reading import read_split
    from coreecg.data.pipeline import build_corpus

    init_ray()
    cfg = load_config(overrides=["data.shard_records=64"]).data
    out = []
    for source, folder in (("ptbxl", "ptbxl"), ("mimic-iv-ecg", "mimic-iv-ecg-layout")):
        build_corpus(source, shared / folder, cache / source, cfg, source_options=cfg.sources.for_source(source, 0))
        for split in ("train", "val", "test"):
            out.append(read_split(cache / source, split, columns=["signal"])["signal"])
    ray.shutdown()
    return np.concatenate(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    p.add_argument("--layouts", default="joint,lead,axial")
    p.add_argument("--decoder", default="time", choices=["time", "latent"], help="which decoder's layout to vary")
    p.add_argument("--objectives", default="core,rec", help="core: alpha=beta=1; rec: beta=0")
    p.add_argument("--data", default="synthetic,real")
    p.add_argument("--shared", default=str(SHARED))
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    from coreecg.data.reading import read_split
    from coreecg.eval.probe import load_probe_data
    from coreecg.data.locate import synthetic_corpus
    from coreecg.train.pretraining import pretrain_local

    tmp = Path(tempfile.mkdtemp(prefix="coreecg-layout-"))
    base = load_config(args.config, ["train.num_workers=1", "train.checkpoint_every_steps=0", *args.set])
    datasets = {}
    if "synthetic" in args.data:
        import ray

        from coreecg.cluster import init_ray
        init_ray()
        corpus = synthetic_corpus(base)
        ray.shutdown()
        datasets["synthetic"] = (read_split(corpus, "train", columns=["signal"])["signal"],
                                 load_probe_data(corpus, base.data.probe_max_windows))
    if "real" in args.data:
        datasets["real"] = (real_windows(Path(args.shared), tmp / "corpora"), None)
    results = []
    for data_name, (windows, probe) in datasets.items():
        for objective in args.objectives.split(","):
            for layout in args.layouts.split(","):
                cfg = load_config(args.config, ["train.num_workers=1", "train.checkpoint_every_steps=0",
                                                f"model.{args.decoder}_decoder_layout={layout}",
                                                *(["methods.core.loss.beta=0"] if objective == "rec" else []),
                                                f"train.eval_every_epochs={base.optim.epochs if probe else 0}",
                                                *args.set])
                run = tmp / f"{data_name}-{objective}-{layout}"
                t0 = time.perf_counter()
                pretrain_local(cfg, windows, run, probe=probe)
                lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
                epochs = [x for x in lines if x.get("kind") == "epoch"]
                init = [x["probe_auroc"] for x in lines if x.get("event") == "probe_init"]
                results.append({
                    "data": data_name, "windows": len(windows), "objective": objective,
                    "decoder": args.decoder, "layout": layout,
                    "steps": epochs[-1]["step"], "loss_rec_per_epoch": [round(x["loss_rec"], 4) for x in epochs],
                    "loss_rec_last": epochs[-1]["loss_rec"],
                    "probe_auroc": epochs[-1].get("probe_auroc"), "probe_auroc_init": init[0] if init else None,
                    "seconds": time.perf_counter() - t0})
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"config": args.config, "set": args.set, "results": results}, indent=1))


if __name__ == "__main__":
    main()
