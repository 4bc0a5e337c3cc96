"""Why a fine-tuned cell's AUROC sits below 0.5 (issue 43; docs/results.md, "Below chance"): per
fine-tuning run of a study's output folder, its test macro AUROC recomputed with scikit-learn from
predictions.csv (against metrics.json), the spread of its probabilities, and the structure of what
varies: the first principal component of the per-class logits, its share of their variance, its
loading signs (NORM first, + by convention) and how well it separates abnormal from normal records.

    python -m experiments.below_chance studies-out/label-efficiency-tiny

A network that learned only its training subset's class prior has near-constant outputs (tiny
probability SD); what is left is one shared direction whose sign per class follows whether the
class is the subset's majority, so a nuisance that moves abnormal records along it inverts every
class's ranking at once.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score


def run_row(run: Path) -> dict:
    m = json.loads((run / "metrics.json").read_text())
    classes = m["class_names"]
    table = pd.read_csv(run / "predictions.csv", dtype=str, keep_default_na=False)
    probs = table[[f"p_{c}" for c in classes]].astype(float).to_numpy().clip(1e-7, 1 - 1e-7)
    y = np.array([[c in labels.split("|") for c in classes] for labels in table["labels"]])
    scored = [k for k in range(len(classes)) if 0 < y[:, k].sum() < len(y)]
    by_hand = float(np.mean([roc_auc_score(y[:, k], probs[:, k]) for k in scored]))
    logits = np.log(probs / (1 - probs))
    centred = logits - logits.mean(0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    load = vt[0] * np.sign(vt[0][0])
    normal = classes.index("NORM") if "NORM" in classes else 0
    abnormal = ~y[:, normal]
    return {"run": run.name, "fraction": m["train_fraction"], "auroc": m["test"]["auroc"], "auroc_sklearn": by_hand,
            "prob_sd": float(np.median(probs.std(0))), "pc1_share": float(s[0] ** 2 / (s ** 2).sum()),
            "signs": "".join("+" if x > 0 else "-" for x in load),
            "pc1_auroc_abnormal": (float(roc_auc_score(abnormal, centred @ load))
                                   if 0 < abnormal.sum() < len(y) else None),
            "best_epoch": m["selection"]["best_epoch"], "epochs": m["selection"]["epochs"],
            "train_class_patients": (m.get("train_subset") or {}).get("class_patients_kept")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study_output", type=Path, help="a study's --output folder (its runs/finetune/*)")
    args = p.parse_args()
    for run in sorted((args.study_output / "runs" / "finetune").iterdir()):
        if (run / "predictions.csv").is_file():
            print(json.dumps(run_row(run)), flush=True)


if __name__ == "__main__":
    main()
