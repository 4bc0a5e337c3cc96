"""Age regression on the shared PTB-XL records (docs/tasks.md): test MAE in years, with its patient-
bootstrap interval, of the Supervised baseline (finetune.mode=scratch), Random init (a seeded random
encoder, linear probe) and a CoRe-ECG encoder pretrained here (linear probe and fine-tuning), for
each seed; and the mean and SD over seeds per row.

    python -m bench.age_regression                          # tiny model, 3 seeds, 20 epochs
    python -m bench.age_regression --seeds 0 1 2 3 4 --epochs 40
    python -m bench.age_regression --quick                  # 1 seed, 2 epochs: a smoke run

What it shows: that the regression path runs end to end and its figures, not which method is
better. The shared records are 250 ECGs (248 with an age; 22 test records): intervals are wide, and
the pretraining is a tiny model's one epoch on the MIMIC-IV-ECG-layout folder (PTB-XL records
rewritten, so the leakage guard's overlap is allowed and recorded). Corpora and runs go into a
temporary folder, removed at the end.
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import SHARED, TINY, emit, machine, parser, progress
from coreecg.config import load_config

ROWS = {  # row -> its fine-tuning overrides (the encoder filled in for the pretrained rows)
    "Supervised": ["finetune.mode=scratch"],
    "Random init (linear)": ["finetune.mode=linear", "finetune.encoder=random"],
    "CoRe-ECG (linear)": ["finetune.mode=linear", "finetune.encoder={encoder}"],
    "CoRe-ECG (fine-tune)": ["finetune.mode=finetune", "finetune.encoder={encoder}", "finetune.lr=1e-3"],
}


def main() -> None:
    p = parser(__doc__, "1 seed, 2 epochs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=20, help="fine-tuning epochs")
    p.add_argument("--input", type=Path, default=SHARED, help="the shared ECG data folder")
    args = p.parse_args()
    seeds, epochs = ([0], 2) if args.quick else (args.seeds, args.epochs)

    from coreecg.cluster import init_ray
    from coreecg.data.pipeline import build_corpus
    from coreecg.train.fit import fit, plan_run

    init_ray(1)       # before the corpus build: coreecg's private cluster, not a bare Ray of Ray Data's
    work = Path(tempfile.mkdtemp(prefix="bench-age-"))
    t0 = time.perf_counter()
    try:
        data = load_config(overrides=["data.shard_records=64"]).data
        age = work / "ptbxl-age"
        manifest = build_corpus("ptbxl", args.input / "ptbxl", age, data, source_options={"task": "age"},
                                log_warnings=False)
        build_corpus("mimic-iv-ecg", args.input / "mimic-iv-ecg-layout", work / "mimic", data, log_warnings=False)
        pre = load_config(overrides=[*TINY, f"data.corpus={work / 'mimic'}", "optim.batch_size=8", "optim.epochs=1",
                                     "optim.warmup_epochs=0", "train.eval_every_epochs=0", "train.num_workers=1",
                                     f"train.storage_path={work}", "train.name=pre", "train.variant=CoRe-ECG"])
        encoder = fit(plan_run(pre, "pretrain")).model
        progress({"pretrained": str(encoder), "s": round(time.perf_counter() - t0, 1)})
        runs = []
        for row, extra in ROWS.items():
            for seed in seeds:
                cfg = load_config(overrides=[
                    *TINY, f"data.corpus={age}", "finetune.allow_overlap=true", "finetune.batch_size=16",
                    "finetune.bootstrap_resamples=1000", "train.num_workers=1", "train.checkpoint_every_steps=0",
                    f"finetune.epochs={epochs}", f"train.seed={seed}", f"train.storage_path={work / 'runs'}",
                    f"train.name={row.split()[0].lower()}-{extra[0].split('=')[1]}-s{seed}",
                    *(x.format(encoder=encoder) for x in extra)])
                m = fit(plan_run(cfg, "finetune")).metrics
                t = m["test"]
                runs.append({"row": row, "seed": seed, "mae": t["mae"], "low": t["ci"]["mae"]["low"],
                             "high": t["ci"]["mae"]["high"], "mae_sd": t["mae_sd"], "r2": t["r2"],
                             "pearson_r": t["pearson_r"], "best_epoch": m["selection"]["best_epoch"]})
                progress(runs[-1])
        summary = {}
        for row in ROWS:
            maes = [r["mae"] for r in runs if r["row"] == row]
            summary[row] = {"mae_mean": statistics.mean(maes),
                            "mae_sd_over_seeds": statistics.stdev(maes) if len(maes) > 1 else None,
                            "seeds": len(maes)}
        emit({"benchmark": "age_regression", "machine": machine(), "task": manifest["task"],
              "settings": {"seeds": seeds, "epochs": epochs, "model": "tests' TINY (ViT 32 wide, depth 2)",
                           "command": "python -m bench.age_regression" + (" --quick" if args.quick else "")},
              "runs": runs, "summary": summary, "wall_s": round(time.perf_counter() - t0, 1)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
