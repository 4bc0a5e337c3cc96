"""Linear probing on cached features against the uncached probe: the wall time of the same
`finetune.mode=linear` run (Ray Train, `coreecg.train.fit`) with `finetune.cache_features=true`
(the frozen encoder embeds train/val/test once, the head trains on the features) and `false`
(the encoder runs on every step and every evaluation), and of today's random-crop probe
(`finetune.probe_crops=random`, uncached training; its val/test features are cached).

    python -m bench.linear_probe                      # PTB-XL from ../shared/ecg-data/ptbxl, tiny model, 50 epochs
    python -m bench.linear_probe --set encoders.coreecg.embed_dim=192 --set encoders.coreecg.depth=6 \\
        --set encoders.coreecg.num_heads=3
    python -m bench.linear_probe --quick              # 3 epochs: a smoke run
    python -m bench.linear_probe --variants cached,uncached   # without the random-crop probe

The encoder is `finetune.encoder=random` (a seeded random encoder of the config's model: what
is timed is the probe, not the encoder's quality). Corpus: PTB-XL built with
`coreecg.data.pipeline.build_corpus` from `--input` into a temporary folder (removed at the
end). Prints one JSON object: per variant `wall_s` (fit() from call to return: Ray Train start,
feature embedding, epochs, validation, test), `loop_s` (the sum of the epochs' step seconds and
validation seconds from metrics.jsonl), `features_s` (the one embedding pass, cached only),
test AUROC; and the speed-ups cached vs each uncached variant.

Measured here (2 CPUs shared with other jobs; 169 train windows, 50 epochs, 1 worker; the
load average the JSON records is given). Before: every epoch's report waited for Ray Train's
controller, which polled its workers every 2 s (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S's default; a
worker's result queue holds one report, the next blocks until the poll collects it), so an
epoch cost >= 2 s whatever it computed: tiny model, cached 122.2 s wall vs uncached 120.2 s,
compute 5.7 s vs 58.9 s. Now coreecg's private cluster polls every 0.1 s (coreecg.cluster), and
this bench starts it before the corpus build (which would otherwise start a bare Ray); a report
costs ~6 ms:

    python -m bench.linear_probe                                                 # tiny: 32 wide, depth 2
      load 27: cached 18.75 s wall (loop 4.64 + features 1.33), uncached 76.74 s (loop 60.85),
      random crops 69.51 s (loop 44.89): 4.1x wall (was 1.0x), 10.2x loop
      load 5.3 (--variants cached,uncached): 25.67 s vs 75.83 s: 3.0x wall
    python -m bench.linear_probe --set encoders.coreecg.embed_dim=64 --variants cached,uncached
      load 21: cached 33.78 s (loop 7.75 + features 5.07), uncached 125.5 s (loop 104.87): 3.7x wall, 8.2x loop
      load 6: cached 28.03 s (loop 5.40 + features 3.42), uncached 121.52 s (loop 101.98): 4.3x wall, 11.8x loop
    python -m bench.linear_probe --set encoders.coreecg.embed_dim=128 --set encoders.coreecg.depth=3 \\
        --variants cached,uncached
      load 1: cached 23.6 s (loop 4.06 + features 6.50), uncached 260.42 s (loop 248.19):
      11.0x wall, 23.5x loop
    Every run: the same test AUROC and best epoch cached and uncached.

What is left of the cached wall time is start-up both variants pay once (13-21 s, varying with
the machine's load; a timeline of tiny runs: 15-21 s from fit() to the worker's loop function
(run folder, training dataset, Ray Train's controller and worker group), 2-3 s to the task's
build) and the one embedding pass. So the wall speed-up passes 10x once the uncached probe's 50
epochs cost ~10x that: at width 128, depth 3, not at the two smallest sizes.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import SHARED, TINY, emit, machine, parser, progress
from coreecg.config import load_config


def _loop_seconds(run_dir: Path) -> float:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(r.get("seconds", 0.0) + r.get("val_seconds", 0.0) for r in lines if r.get("kind") == "epoch")


def main(argv=None) -> int:
    p = parser(__doc__, "3 epochs")
    p.add_argument("--input", default=str(SHARED / "ptbxl"), help="PTB-XL records (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--workers", type=int, default=1, help="train.num_workers (default 1)")
    p.add_argument("--variants", default="cached,uncached,uncached_random_crops",
                   help="comma-separated subset of the variants to time (default: all; cached is always run)")
    p.add_argument("--set", action="append", default=[], dest="overrides", help="config override (repeatable)")
    args = p.parse_args(argv)
    epochs = 3 if args.quick else args.epochs

    from coreecg.cluster import init_ray
    from coreecg.data.pipeline import build_corpus
    from coreecg.train.fit import fit, plan_run

    # Before the corpus build: Ray Data would otherwise start a bare Ray of its own (ray.init()),
    # and init_ray would then keep it, without the private cluster's settings (coreecg.cluster).
    init_ray(args.workers * load_config(overrides=[*TINY, *args.overrides]).train.cpus_per_worker)
    tmp = Path(tempfile.mkdtemp(prefix="bench-linear-"))
    try:
        data = load_config(overrides=["data.shard_records=64"]).data
        t = time.perf_counter()
        build_corpus("ptbxl", args.input, tmp / "ptbxl", data, source_options=data.sources.for_source("ptbxl", 0))
        manifest = json.loads((tmp / "ptbxl" / "manifest.json").read_text())
        progress({"corpus_built_s": round(time.perf_counter() - t, 1), "windows": manifest["counts"]["windows"]})
        base = [*TINY, *args.overrides, f"data.corpus={tmp / 'ptbxl'}", "finetune.encoder=random",
                "finetune.mode=linear", f"finetune.epochs={epochs}", "finetune.batch_size=32",
                "finetune.linear_lr=1e-2",
                "finetune.bootstrap_resamples=0", "finetune.tsne_max_points=0", "train.figures=false",
                f"train.num_workers={args.workers}", "train.checkpoint_every_steps=0", "train.keep_checkpoints=1",
                f"train.storage_path={tmp / 'runs'}"]
        model = load_config(overrides=base).model
        variants = {"cached": ["finetune.cache_features=true"],
                    "uncached": ["finetune.cache_features=false"],
                    "uncached_random_crops": ["finetune.cache_features=false", "finetune.probe_crops=random"]}
        wanted = {"cached", *args.variants.split(",")}
        if wanted - set(variants):
            p.error(f"--variants: unknown {sorted(wanted - set(variants))}")
        out = {}
        for name, extra in ((n, e) for n, e in variants.items() if n in wanted):
            cfg = load_config(overrides=[*base, *extra, f"train.name={name}"])
            t = time.perf_counter()
            result = fit(plan_run(cfg, "finetune"))
            wall = time.perf_counter() - t
            m = json.loads((result.run_dir / "metrics.json").read_text())
            out[name] = {"wall_s": round(wall, 2), "loop_s": round(_loop_seconds(result.run_dir), 2),
                         "features_s": m["probe"].get("features_seconds"), "test_auroc": m["test"]["auroc"],
                         "val_auroc": m["val"]["auroc"], "best_epoch": m["selection"]["best_epoch"]}
            progress({name: out[name]})
        c = out["cached"]
        result = {
            "benchmark": "linear_probe", "epochs": epochs, "corpus": "ptbxl (" + args.input + ")",
            "windows": manifest["counts"]["windows"],
            "model": {k: getattr(model, k) for k in ("embed_dim", "depth", "num_heads")},
            "overrides": args.overrides, "workers": args.workers,
            "ray_train_health_check_interval_s": os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S",
                                                                "Ray's default (2.0)"),
            **out,
            **{f"speedup_{kind}_vs_{short}": round(out[name][f"{kind}_s"] / (c["wall_s"] if kind == "wall" else
                                                                          c["loop_s"] + (c["features_s"] or 0)), 2)
               for name, short in (("uncached", "uncached"), ("uncached_random_crops", "random_crops"))
               if name in out for kind in ("wall", "loop")},
            **({"test_auroc_abs_diff_cached_uncached": abs(c["test_auroc"] - out["uncached"]["test_auroc"])}
               if "uncached" in out else {}),
            "machine": machine(),
        }
        emit(result)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
