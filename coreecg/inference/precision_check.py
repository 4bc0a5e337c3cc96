"""A precision path's accuracy against float32, measured and bounded.

`compare` gives the differences of one path's outputs from float32's on the same windows
(probabilities: absolute; embeddings: the L2 distance over the float32 embedding's L2 norm, per
window). `check_split` adds the macro AUROC of a classifier on a labelled (held-out) split under
both, with a paired patient-bootstrap interval of the difference (the same resampled patients for
both). `verdict` applies the bounds of the model's `inference` config section; a refused path
names the figure that broke its bound. `first_pass_guard` is the check every inference run makes
on its first forward pass when the model has no recorded check for the path.

The checks of a model are recorded beside it (`precision_checks.json` in its run or export
folder, `record_checks`) and read back by `recorded_checks`: a path refused there is refused by
jobs/predict.py, and skipped by `auto`.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from coreecg.data.corpus import load_manifest
from coreecg.data.reading import read_split
from coreecg.eval.downstream import load_split, predict, to_records
from coreecg.eval.metrics import aggregate_by_record, kept_classes, patient_resample_weights, resample_metrics
from coreecg.files import write_atomic
from coreecg.inference.items import InferenceError
from coreecg.inference.model_input import PooledEncoder, input_spec
from coreecg.inference.precision import PrecisionError, prepare_model, resolve_precision, cpu_units
from coreecg.weights import PRECISION_CHECKS_FILE as CHECKS_FILE

BOOTSTRAP_RESAMPLES = 1000
CHECK_WINDOWS = 4000          # at most this many windows of the split, evenly spaced (read_split)
CHECK_BATCH = 64


def compare(ref_probs: np.ndarray | None, ref_feats: np.ndarray, probs: np.ndarray | None,
            feats: np.ndarray) -> dict[str, Any]:
    """Differences of a path's outputs from float32's on the same n windows.

    ref_feats, feats: (n, D); ref_probs, probs: (n, K) or None (an encoder) ->
    {"embedding": {"max", "mean"} of ||f - f32|| / ||f32|| per window, "embedding_abs": {"max", "mean"}
    of |f - f32|, "probability": {"max", "mean"} of |p - p32| (None for an encoder)}."""
    f, r = np.asarray(feats, np.float64), np.asarray(ref_feats, np.float64)
    rel = np.linalg.norm(f - r, axis=1) / np.maximum(np.linalg.norm(r, axis=1), 1e-12)
    absd = np.abs(f - r)
    out: dict[str, Any] = {"windows": int(len(r)),
                           "embedding": {"max": float(rel.max(initial=0.0)),
                                         "mean": float(rel.mean()) if len(rel) else 0.0},
                           "embedding_abs": {"max": float(absd.max(initial=0.0)),
                                             "mean": float(absd.mean()) if absd.size else 0.0},
                           "probability": None}
    if ref_probs is not None and probs is not None:
        d = np.abs(np.asarray(probs, np.float64) - np.asarray(ref_probs, np.float64))
        out["probability"] = {"max": float(d.max(initial=0.0)), "mean": float(d.mean()) if d.size else 0.0}
    return out


def bounds_of(config: Any) -> dict[str, float]:
    """The bounds of a model's config (its `inference` section)."""
    s = config.inference
    return {"max_auroc_drop": s.max_auroc_drop, "max_probability_diff": s.max_probability_diff,
            "max_embedding_diff": s.max_embedding_diff}


def verdict(diffs: dict[str, Any], bounds: dict[str, float]) -> tuple[bool, str]:
    """(accepted, reason): every measured figure within its bound, or the first that is not."""
    emb = diffs["embedding"]["max"]
    if emb > bounds["max_embedding_diff"]:
        return False, (f"embeddings differ from float32's by up to {emb:.4f} of their norm, over the bound "
                       f"{bounds['max_embedding_diff']} (inference.max_embedding_diff)")
    prob = diffs.get("probability")
    if prob and prob["max"] > bounds["max_probability_diff"]:
        return False, (f"probabilities differ from float32's by up to {prob['max']:.4f}, over the bound "
                       f"{bounds['max_probability_diff']} (inference.max_probability_diff)")
    auroc = diffs.get("auroc")
    if auroc and auroc_refuses(auroc, bounds["max_auroc_drop"]):
        return False, (f"macro AUROC {auroc['path']:.4f} against float32's {auroc['fp32']:.4f} on {auroc['split']}: "
                       f"a drop of {100 * auroc['drop']:.2f} points (95 % CI of the difference "
                       f"[{100 * auroc['ci'][0]:+.2f}, {100 * auroc['ci'][1]:+.2f}]), over the bound "
                       f"{100 * bounds['max_auroc_drop']:.2f} (inference.max_auroc_drop)")
    figures = [f"embeddings within {emb:.4f} of their norm"]
    if prob:
        figures.append(f"probabilities within {prob['max']:.4f}")
    if auroc and auroc.get("drop") is not None:
        figures.append(f"macro AUROC {100 * auroc['diff']:+.2f} points")
        if auroc["drop"] > bounds["max_auroc_drop"]:
            lo, hi = auroc["ci"]
            figures.append(f"a drop over the bound that {auroc['records']} records cannot tell from resampling "
                           f"(95 % CI [{100 * lo:+.2f}, {100 * hi:+.2f}] holds 0)")
    return True, "against float32: " + "; ".join(figures)


def auroc_refuses(auroc: dict[str, Any], bound: float) -> bool:
    """A path's AUROC cost refuses it when the drop is over `bound` and the paired patient bootstrap
    tells it from resampling (the interval of the difference lies below 0). With few positives, a
    path whose probabilities move by 1e-3 swaps a near-tied pair and the point estimate moves by
    points (measured: docs/performance.md "CPU inference precision"); the probability and
    embedding bounds still hold such a path."""
    hi = (auroc.get("ci") or [None, None])[1]
    return auroc.get("drop") is not None and auroc["drop"] > bound and hi is not None and hi < 0


def paired_auroc(y: np.ndarray, ref_probs: np.ndarray, probs: np.ndarray, patient_id: Sequence,
                 multilabel: bool, seed: int = 0, n_resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
    """Macro AUROC under float32 and the path on one set of records, and the difference
    (path - float32) with its paired patient-bootstrap 95 % interval.

    y: (m, K) {0, 1}; ref_probs, probs: (m, K); patient_id: (m,)."""
    y = np.asarray(y).astype(bool)
    keep = kept_classes(y, patient_id, 1)
    one = np.ones((1, len(y)))
    a32 = float(resample_metrics(y, ref_probs, multilabel, one, keep)["auroc"][0])
    ap = float(resample_metrics(y, probs, multilabel, one, keep)["auroc"][0])
    w = patient_resample_weights(patient_id, n_resamples, np.random.default_rng(seed))
    d = (resample_metrics(y, probs, multilabel, w, keep)["auroc"]
         - resample_metrics(y, ref_probs, multilabel, w, keep)["auroc"])
    d = d[~np.isnan(d)]
    low, high = (float(q) for q in np.quantile(d, [0.025, 0.975])) if len(d) else (None, None)
    return {"fp32": a32, "path": ap, "diff": ap - a32, "drop": max(0.0, a32 - ap), "ci": [low, high],
            "records": int(len(y)), "patients": int(len(np.unique(np.asarray(patient_id)))),
            "resamples": int(n_resamples)}


def check_entry(precision: str, diffs: dict[str, Any], bounds: dict[str, float], on: str,
                seconds: float | None = None) -> dict[str, Any]:
    """One path's check as recorded: its figures, bounds, verdict and where it was measured."""
    accepted, reason = verdict(diffs, bounds)
    units = cpu_units()
    return {"precision": precision, "accepted": accepted, "reason": reason, "checked_on": on, **diffs,
            "bounds": dict(bounds), "processor": units.describe(), "torch": torch.__version__,
            "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **({"seconds": round(seconds, 2)} if seconds is not None else {})}


def check_model(loaded: Any, corpus: str | Path, split: str = "test", precisions: Sequence[str] = ("bf16", "int8"),
                device: torch.device | None = None, max_windows: int = CHECK_WINDOWS,
                seed: int = 0) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each path of `precisions` against float32 on a corpus split's windows -> ({precision:
    check_entry}, {precision: why it was not checked here}).

    A classifier is scored on the split's labelled windows (`load_split`): window differences,
    and the macro AUROC of its records (window means) under both with the paired patient
    bootstrap (`paired_auroc`); an encoder on the split's windows: embedding differences. A path
    this device cannot run (no bf16 units) is not checked (the second dict says why): that says
    nothing of the model. One the model cannot take (int8 on a convolutional encoder) is
    recorded refused, with the reason."""
    dev = device or torch.device("cpu")
    spec = input_spec(loaded)
    stored = list(load_manifest(corpus)["signal"]["leads"])
    missing = [x for x in spec.leads if x not in stored]
    if missing:
        raise InferenceError(f"{corpus}: lacks lead(s) {', '.join(missing)} the model takes")
    rows = [stored.index(x) for x in spec.leads]
    if spec.kind == "classifier":
        data = load_split(corpus, split)
        if len(data.record_id) > max_windows:                  # evenly spaced, as read_split spaces them
            keep = np.linspace(0, len(data.record_id) - 1, max_windows).round().astype(int)
            data = dataclasses.replace(data, signal=data.signal[keep], record_id=data.record_id[keep],
                                       patient_id=data.patient_id[keep], multihot=data.multihot[keep], uid=None)
        signal, ids = data.signal, data.record_id
        model = loaded.model
    else:
        d = read_split(corpus, split, ["record_id", "signal"], max_windows=max_windows, as_stored=True)
        signal, ids = d["signal"], d["record_id"]
        data, model = None, PooledEncoder(loaded.model, spec.leads)
    model = model.to(dev).eval()
    if not len(signal):
        raise InferenceError(f"{corpus}: its {split} split has no windows to check precision on")
    on = f"{corpus} {split} split: {len(signal)} windows" + (
        f", {len(np.unique(data.record_id))} records" if data is not None else "")
    example = torch.zeros(1, len(spec.leads), spec.crop, device=dev)

    def run(m: torch.nn.Module, autocast: str) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            return predict(m, signal, rows, spec.crop, spec.n_crops, dev, CHECK_BATCH, autocast)

    ref = run(model, "fp32")
    bounds = bounds_of(loaded.config)
    checks: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for p in precisions:
        try:
            choice = resolve_precision(p, dev)
        except PrecisionError as e:
            skipped[p] = str(e)
            continue
        t0 = time.perf_counter()
        try:
            m, autocast = prepare_model(model, choice.precision, dev, example, loaded.config.inference.fuse)
            out = run(m, autocast)
        except (PrecisionError, RuntimeError, TypeError, NotImplementedError) as e:   # the model cannot take it
            why = str(e) if isinstance(e, PrecisionError) else f"{type(e).__name__}: {str(e).splitlines()[0]}"
            checks[p] = {"precision": p, "accepted": False, "reason": why, "checked_on": on,
                         "bounds": dict(bounds), "processor": cpu_units().describe()}
            continue
        cls = spec.kind == "classifier"
        diffs = compare(ref[0] if cls else None, ref[1], out[0] if cls else None, out[1])
        if cls:
            r32, rp = to_records(data, *ref), to_records(data, *out)
            diffs["auroc"] = {"split": split, **paired_auroc(r32.y, r32.probs, rp.probs, r32.patient_id,
                                                              bool(spec.multilabel), seed=seed)}
        else:
            _, fr = aggregate_by_record(ids, ref[1])
            _, fp = aggregate_by_record(ids, out[1])
            diffs["record_embedding"] = compare(None, fr, None, fp)["embedding"]
        checks[p] = check_entry(p, diffs, bounds, on, time.perf_counter() - t0)
    return checks, skipped


def record_checks(folder: str | Path, checks: dict[str, dict[str, Any]]) -> Path:
    """Write {precision: check_entry} as `folder`/precision_checks.json (merged with what is there)."""
    path = Path(folder) / CHECKS_FILE
    merged = {**_read(path), **checks}
    return write_atomic(path, lambda tmp: Path(tmp).write_text(json.dumps(merged, indent=1, sort_keys=True)))


def recorded_checks(source: str | Path | None) -> dict[str, dict[str, Any]]:
    """The recorded checks of a model's source (its folder, or the folder of its file); {} if none."""
    if source is None:
        return {}
    p = Path(source)
    return _read((p if p.is_dir() else p.parent) / CHECKS_FILE)


def refusals(checks: dict[str, dict[str, Any]]) -> dict[str, str]:
    """{precision: reason} of the paths recorded checks (`recorded_checks`) refused."""
    return {k: v["reason"] for k, v in checks.items() if not v.get("accepted", True)}


def _read(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable precision check file ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of precision -> check")
    return data


__all__ = ["BOOTSTRAP_RESAMPLES", "CHECKS_FILE", "auroc_refuses", "bounds_of", "check_entry", "check_model", "compare",
           "paired_auroc",
           "record_checks", "recorded_checks", "refusals", "verdict"]
