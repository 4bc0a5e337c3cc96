"""A leaderboard of pretraining runs, from their run folders: the way `coreecg.eval.report` turns
fine-tuning runs into the paper's tables, this turns pretraining runs into one table.

    rows = leaderboard_rows(find_pretraining_runs(Path("runs")))
    write_leaderboard(rows, Path("runs"))        # runs/leaderboard.csv, runs/leaderboard.md

One row per run: method (train.variant or the method's label), run name, status, the last
epoch's loss and the loss terms its method reports (`reported_losses`: a column each, n/a for a
method that does not report it), the last probe_auroc beside its value at init (and the difference), steps, epochs
done of planned, wall time (run.json's finished sessions; else the epochs' own seconds) and the
run folder. Rows are sorted by probe_auroc, best first (runs without a probe last, by loss).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from coreecg.config import load_config
from coreecg.run_record import wall_seconds

# The columns; the loss terms the rows' methods report sit between the two (`leaderboard_rows`).
COLUMNS = ("rank", "method", "run", "status", "loss")
AFTER_LOSSES = ("probe_auroc", "probe_auroc_init", "probe_gain", "steps", "epochs", "wall_s", "run_dir")


def is_pretraining_run(folder: Path) -> bool:
    """A run folder of a pretraining: its config and metrics, and no fine-tuning outputs."""
    return ((folder / "config.yaml").is_file() and (folder / "metrics.jsonl").is_file()
            and not (folder / "metrics.json").exists() and not (folder / "best.pt").exists())


def find_pretraining_runs(root: Path) -> list[Path]:
    """Pretraining run folders at most two levels under `root` (runs/<name>, sweeps/x/trials/<id>)."""
    root = Path(root)
    candidates = [root, *root.glob("*"), *root.glob("*/*")]
    return sorted(p for p in candidates if p.is_dir() and is_pretraining_run(p))


def _records(folder: Path) -> list[dict[str, Any]]:
    out = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:          # a line torn by a kill
            continue
    return out


def run_row(folder: Path) -> dict[str, Any]:
    folder = Path(folder).resolve()
    cfg = load_config(folder / "config.yaml")
    records = _records(folder)
    epochs = [r for r in records if r.get("kind") == "epoch"]
    last = epochs[-1] if epochs else {}
    probes = [r for r in epochs if isinstance(r.get("probe_auroc"), float)]
    init = next((r["probe_auroc"] for r in records if r.get("event") == "probe_init"), math.nan)
    probe = probes[-1]["probe_auroc"] if probes else math.nan
    wall = wall_seconds(folder)
    if wall is None:
        wall = sum(float(r.get("seconds", 0.0)) for r in epochs) or math.nan
    done = (folder / "encoder.pt").is_file() and len(epochs) > 0 and int(last.get("epoch", 0)) >= cfg.optim.epochs
    losses = cfg.method.reported_losses
    return {"method": cfg.method_label, "run": folder.name,
            "status": "completed" if done else ("running or stopped" if epochs else "not started"),
            "loss": last.get("loss", math.nan), **{k: last.get(k, math.nan) for k in losses},
            "probe_auroc": probe, "probe_auroc_init": init,
            "probe_gain": probe - init, "steps": int(last.get("step", 0)),
            "epochs": f"{int(last.get('epoch', 0))}/{cfg.optim.epochs}", "wall_s": wall, "run_dir": str(folder)}


def leaderboard_rows(folders: list[Path]) -> list[dict[str, Any]]:
    rows = [run_row(f) for f in folders]

    def key(r: dict[str, Any]) -> tuple:
        p, loss = r["probe_auroc"], r["loss"]
        return (math.isnan(p), -p if not math.isnan(p) else 0.0, loss if not math.isnan(loss) else math.inf)

    rows.sort(key=key)
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    losses = list(dict.fromkeys(k for r in rows for k in r if k.startswith("loss_")))   # the methods' terms
    return [{c: r.get(c, math.nan) for c in (*COLUMNS, *losses, *AFTER_LOSSES)} for r in rows]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def write_leaderboard(rows: list[dict[str, Any]], output: Path) -> list[Path]:
    """leaderboard.csv (every column, full precision) and leaderboard.md into `output`."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = output / "leaderboard.csv", output / "leaderboard.md"
    shown = list(rows[0]) if rows else [*COLUMNS, *AFTER_LOSSES]      # leaderboard_rows' columns
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, shown)
        w.writeheader()
        w.writerows(rows)
    lines = ["# Pretraining leaderboard", "",
             "probe_auroc: the in-loop few-label linear probe (docs/decisions.md), last evaluation; "
             "probe_gain = probe_auroc - probe_auroc_init (the randomly initialised encoder). "
             "Losses: the last epoch's means. wall_s: the run's finished sessions (run.json).", "",
             "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for r in rows:
        cells = [_cell(r[c]) if c != "wall_s" else ("n/a" if math.isnan(r[c]) else f"{r[c]:.0f}") for c in shown]
        lines.append("| " + " | ".join(cells) + " |")
    md_path.write_text("\n".join(lines) + "\n")
    return [csv_path, md_path]
