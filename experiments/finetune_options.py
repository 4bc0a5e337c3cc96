"""Each fine-tuning option once against the default, on the shared PTB-XL records: the options
the compared baselines fine-tune with (finetune.augment, finetune.layer_decay, finetune.head)
and the head-only modes' own rate (finetune.linear_lr against the fine-tuning rate 8e-5).

    python -m experiments.finetune_options                 # tiny model, 20 epochs, ~5 min on 2 busy CPUs
    python -m experiments.finetune_options --quick         # 2 epochs: a smoke run
    python -m experiments.finetune_options --set finetune.lr=3e-4

Encoder: a tiny CoRe-ECG pretraining (tests' TINY model, `--pretrain-epochs`) on the train split
of the same PTB-XL corpus (its labels unused; `finetune.allow_overlap=true` because the leakage
guard compares whole corpora). Every row starts from that encoder, with the same seed, batch
16 and epochs; the fine-tuning rows share `finetune.lr=1e-3` (a tiny model on ~170 windows
learns nothing in 20 epochs at the paper's 8e-5: docs/evaluation.md); each option row changes
one thing. Corpus: `coreecg.data.pipeline.build_corpus` from `--input` into a temporary folder
(removed at the end). The shared loop in this process (`fit(..., report_fn)`: one worker).

Prints one JSON object: per row its overrides, test macro AUROC with its patient-bootstrap 95 %
interval, validation AUROC, the selected epoch and wall seconds (fit() call to return: on a
shared machine, a figure of the load it ran under, recorded in "machine"). One seed on ~40
test windows: differences inside the intervals are not findings; the table shows that each
option runs end to end and where it lands, not a ranking.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import SHARED, TINY, machine
from coreecg.config import FINETUNE_AUGMENT_OPS, load_config

ROWS = {
    "default": ["finetune.mode=finetune"],
    "augment": ["finetune.mode=finetune", f"finetune.augment=[{','.join(FINETUNE_AUGMENT_OPS)}]"],
    "layer_decay_0.75": ["finetune.mode=finetune", "finetune.layer_decay=0.75"],
    "attention_head": ["finetune.mode=finetune", "finetune.head=attention"],
    "linear_lr_8e-5": ["finetune.mode=linear", "finetune.linear_lr=8e-5"],
    "linear_default": ["finetune.mode=linear"],
}


def _progress(obj: dict) -> None:
    print(json.dumps(obj), file=sys.stderr, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.finetune_options", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=str(SHARED / "ptbxl"), help="PTB-XL records (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=20, help="fine-tuning epochs of every row")
    p.add_argument("--pretrain-epochs", type=int, default=10)
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of: %(default)s")
    p.add_argument("--quick", action="store_true", help="2 epochs, 1 pretraining epoch: a smoke run")
    p.add_argument("--set", action="append", default=[], dest="overrides", help="config override (repeatable)")
    args = p.parse_args(argv)
    rows = args.rows.split(",")
    if set(rows) - set(ROWS):
        p.error(f"--rows: unknown {sorted(set(rows) - set(ROWS))}; known: {', '.join(ROWS)}")
    epochs, pre_epochs = (2, 1) if args.quick else (args.epochs, args.pretrain_epochs)

    from coreecg.cluster import init_ray
    from coreecg.data.pipeline import build_corpus
    from coreecg.train.fit import fit, plan_run

    init_ray(1)          # before the corpus build (coreecg.cluster: the private cluster's settings)
    tmp = Path(tempfile.mkdtemp(prefix="exp-ftopt-"))
    try:
        data = load_config(overrides=["data.shard_records=64"]).data
        build_corpus("ptbxl", args.input, tmp / "ptbxl", data, source_options=data.sources.for_source("ptbxl", 0))
        corpus = tmp / "ptbxl"
        common = [*TINY, f"data.corpus={corpus}", "train.num_workers=1", "train.checkpoint_every_steps=0",
                  "train.keep_checkpoints=1", "train.figures=false", f"train.storage_path={tmp / 'runs'}"]
        t = time.perf_counter()
        pre = load_config(overrides=[*common, "optim.batch_size=16", f"optim.epochs={pre_epochs}",
                                     "optim.warmup_epochs=0", "train.eval_every_epochs=0", "train.name=pre"])
        encoder = fit(plan_run(pre, "pretrain"), report_fn=lambda m: None).model
        _progress({"pretrained_s": round(time.perf_counter() - t, 1), "encoder": str(encoder)})
        base = [*common, f"finetune.encoder={encoder}", "finetune.allow_overlap=true", "finetune.lr=1e-3",
                f"finetune.epochs={epochs}", "finetune.batch_size=16", "finetune.bootstrap_resamples=200",
                "finetune.tsne_max_points=0", *args.overrides]
        out = {}
        for name in rows:
            cfg = load_config(overrides=[*base, *ROWS[name], f"train.name={name}"])
            t = time.perf_counter()
            result = fit(plan_run(cfg, "finetune"), report_fn=lambda m: None)
            wall = time.perf_counter() - t
            m = json.loads((result.run_dir / "metrics.json").read_text())
            test = m["test"]
            out[name] = {"set": ROWS[name], "test_auroc": test["auroc"],
                         "test_auroc_ci": [test["ci"]["auroc"]["low"], test["ci"]["auroc"]["high"]],
                         "val_auroc": m["val"]["auroc"], "best_epoch": m["selection"]["best_epoch"],
                         "wall_s_under_load": round(wall, 1)}
            _progress({name: out[name]})
        print(json.dumps({"experiment": "finetune_options", "epochs": epochs, "pretrain_epochs": pre_epochs,
                          "corpus": f"ptbxl ({args.input})", "base": base[len(common):], "rows": out,
                          "machine": machine()}, indent=1, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
