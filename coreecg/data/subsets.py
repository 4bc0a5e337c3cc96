"""The label-efficiency subset: fine-tune on a fixed, seeded fraction of the training patients.

    keep = stratified_patient_subset(patient_ids, multihot, fraction=0.05, seed=0, class_names=names)
    train_rows = rows[keep]                                 # validation and test are never touched
    metrics["train_subset"] = subset_summary(patient_ids, multihot, keep, names)

The unit is the patient: all rows (windows) of a patient are kept or dropped together, and a
patient's label set is the union of its rows' labels. The number of kept patients is
max(1, round(fraction * n_patients)) (Python's round, half to even), exactly.

Algorithm: iterative stratification (Sechidis, Tsoumakas & Vlahavas 2011, "On the stratification
of multi-label data") for two subsets, kept and rest, with desired proportions (r, 1 - r),
r = n_keep / n_patients (the rounded fraction). Label-powerset stratification is not used: with
25 classes the label combinations number in the hundreds to thousands, most held by one or two
patients, so strata are too small to split by any fraction. The iterative method instead:

  1. orders patients by sorted id, then by a permutation from numpy's Generator(seed), so the
     result depends on (patients, labels, fraction, seed) only: not on row order, not on Python's
     hash randomisation;
  2. repeatedly takes the label with the fewest unassigned patients (ties: lowest class index)
     and hands each of its unassigned patients, in seeded order, to the subset with the largest
     remaining desired count for that label; ties go to the larger remaining desired total, then
     to a seeded coin. Every label of the patient and the subset's total are then decremented;
  3. distributes patients with no label at all by remaining desired totals.
  A subset whose desired total is used up takes no more patients (a departure from the paper,
  which lets totals drift), so the kept count is exact. Single-label data is the special case
  of one label per patient.

Every class that has a patient in the input keeps at least one (a class of 2 patients at 5% would
otherwise get none). A missing class is repaired by swapping: bring in the patient of that class,
and take out the kept patient, that together change the other classes' kept counts least
(deviation from target measured relative to class size; a kept patient without labels costs
nothing), never emptying another class. When no single swap works, a greedy cover of all classes
is tried; if even that needs more patients than are kept, `SubsetError` names the empty classes,
the fraction and the counts, and suggests a fraction that works. Classes absent from the whole
input are ignored (the caller decides what that means).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

import numpy as np

_TIE = 1e-9


class SubsetError(ValueError):
    """A label-efficiency subset that cannot be built as asked (raised before any training)."""


def _patients(patient_ids: Sequence[str], multihot: np.ndarray,
              class_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """-> (sorted unique ids (P,), row -> patient index (n,), patient labels (P, K) bool, rows per patient (P,))."""
    ids = np.asarray([str(p) for p in patient_ids])
    y = np.asarray(multihot)
    if y.ndim != 2:
        raise SubsetError(f"multihot must be (n_rows, n_classes), got shape {y.shape}")
    n, k = y.shape
    if ids.shape != (n,):
        raise SubsetError(f"patient_ids has {ids.size} entries but multihot has {n} rows")
    if k != len(class_names):
        raise SubsetError(f"multihot has {k} columns but {len(class_names)} class names were given")
    if y.size and not np.isin(y, (0, 1)).all():
        raise SubsetError("multihot must hold only 0 and 1")
    y = y.astype(bool)
    uniq, inverse = np.unique(ids, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    rows = np.bincount(inverse, minlength=uniq.size)
    starts = np.concatenate(([0], np.cumsum(rows)[:-1]))
    labels = (np.maximum.reduceat(y[order], starts, axis=0) if n and k
              else np.zeros((uniq.size, k), dtype=bool))
    return uniq, inverse, labels.astype(bool), rows


def _check_fraction(fraction: float) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, Real) or not 0.0 < float(fraction) <= 1.0:
        raise SubsetError(f"fraction must lie in (0, 1], got {fraction!r}")
    return float(fraction)


def _iterative_stratification(labels: np.ndarray, n_keep: int, rng: np.random.Generator) -> np.ndarray:
    """labels (P, K) bool in processing order -> (P,) bool, True for the n_keep kept patients."""
    p = labels.shape[0]
    r = n_keep / p
    counts = labels.sum(0)
    need = [(r * counts).tolist(), ((1.0 - r) * counts).tolist()]   # desired per label: kept, rest
    total = [n_keep, p - n_keep]                                    # desired totals
    coin = (rng.random(p) < 0.5).tolist()                           # a seeded tie-break per patient
    label_lists = np.split(np.nonzero(labels)[1], np.cumsum(labels.sum(1))[:-1]) if p else []
    label_lists = [a.tolist() for a in label_lists]
    subset = np.full(p, -1, dtype=np.int8)

    def give(i: int, j: int) -> None:
        subset[i] = j
        total[j] -= 1
        nj = need[j]
        for c in label_lists[i]:
            nj[c] -= 1.0

    while True:
        remaining = labels[subset < 0].sum(0)
        if not remaining.any():
            break
        lab = int(np.argmin(np.where(remaining > 0, remaining, np.iinfo(np.int64).max)))
        for i in np.flatnonzero(labels[:, lab] & (subset < 0)).tolist():
            if total[0] <= 0:
                j = 1
            elif total[1] <= 0:
                j = 0
            else:
                d = need[0][lab] - need[1][lab]
                if abs(d) > _TIE:
                    j = 0 if d > 0 else 1
                elif total[0] != total[1]:
                    j = 0 if total[0] > total[1] else 1
                else:
                    j = 0 if coin[i] else 1
            give(i, j)
    for i in np.flatnonzero(subset < 0).tolist():                  # patients without any label
        if total[0] != total[1]:
            j = 0 if total[0] > total[1] else 1
        else:
            j = 0 if coin[i] else 1
        give(i, j)
    return subset == 0


def _swap_in(labels: np.ndarray, kept: np.ndarray, target: np.ndarray, scale: np.ndarray,
             cls: int) -> bool:
    """Bring in a patient of class `cls` for a kept one, changing the other classes least; in place.

    Returns False when no swap keeps every currently kept class present.
    """
    k_now = labels[kept].sum(0).astype(float)
    cand = np.flatnonzero(labels[:, cls] & ~kept)
    kept_idx = np.flatnonzero(kept)
    kept_labels = labels[kept_idx]
    patterns, first = np.unique(labels[cand], axis=0, return_index=True)
    add_gain = (np.abs(k_now + 1 - target) - np.abs(k_now - target)) / scale
    best = None                                                     # (cost, order, patient in, patient out)
    for pattern, f in sorted(zip(patterns, first.tolist()), key=lambda t: t[1]):
        after = k_now + pattern
        ok = ~(kept_labels & (after <= 1)).any(1)                   # never empty a class
        if not ok.any():
            continue
        rem_gain = (np.abs(after - 1 - target) - np.abs(after - target)) / scale
        cost_out = np.where(ok, kept_labels @ rem_gain, np.inf)
        q = int(np.argmin(cost_out))
        cost = float(pattern @ add_gain) + float(cost_out[q])
        if best is None or cost < best[0] - _TIE:
            best = (cost, f, int(cand[f]), int(kept_idx[q]))
    if best is None:
        return False
    kept[best[2]], kept[best[3]] = True, False
    return True


def _kept_has(labels: np.ndarray, kept: np.ndarray, c: int) -> bool:
    """Whether some kept patient has class c."""
    return bool((labels[:, c] & kept).any())


def _greedy_cover(labels: np.ndarray, present: np.ndarray, prefer: np.ndarray | None = None) -> list[int]:
    """Patients covering every present class, greedily: most new classes; ties: `prefer`, then order."""
    uncovered = present.copy()
    cover: list[int] = []
    bonus = 0.5 * prefer if prefer is not None else 0.0
    while uncovered.any():
        gain = labels[:, uncovered].sum(1) + bonus
        i = int(np.argmax(gain))
        cover.append(i)
        uncovered &= ~labels[i]
    return cover


def _keep_every_class(lab: np.ndarray, kept: np.ndarray, n_keep: int, fraction: float,
                      class_names: Sequence[str]) -> None:
    """Every class with a patient present in `kept` (P,) bool, its n_keep patients, in place: swaps
    first, rarest class first, then a greedy cover of the classes filled up to n_keep. lab: (P, K)
    bool per patient. SubsetError when no cover fits in n_keep patients."""
    n_patients = len(lab)
    counts = lab.sum(0)
    present = counts > 0
    target = (n_keep / n_patients) * counts
    scale = np.maximum(counts, 1).astype(float)
    by_rarity = sorted(np.flatnonzero(present).tolist(), key=lambda c: (counts[c], c))
    for c in by_rarity:
        if _kept_has(lab, kept, c):
            continue
        if not _swap_in(lab, kept, target, scale, c):
            break
    missing = [c for c in by_rarity if not _kept_has(lab, kept, c)]
    if missing:
        # Preferring kept patients disturbs least; the plain cover depends on the seed only, so
        # the fraction suggested from it is sure to work with this seed.
        plain = _greedy_cover(lab, present)
        cover = min(_greedy_cover(lab, present, kept), plain, key=len)
        if len(cover) > n_keep:
            names = [str(class_names[c]) for c in sorted(missing)]
            suggest = math.ceil(len(plain) / n_patients * 1000) / 1000
            raise SubsetError(
                f"fraction {fraction} keeps {n_keep} of {n_patients} training patients, too few to keep "
                f"all {int(present.sum())} classes present: {len(names)} would have no patient: "
                f"{', '.join(names)}. The smallest cover of every class found takes {len(cover)} "
                f"patients; use a larger fraction (>= {suggest:g}).")
        in_cover = set(cover)
        fill = [i for i in np.flatnonzero(kept).tolist() if i not in in_cover]
        kept[:] = False
        kept[cover] = True
        kept[fill[:n_keep - len(cover)]] = True


def stratified_patient_subset(patient_ids: Sequence[str], multihot: np.ndarray, fraction: float,
                              seed: int, class_names: Sequence[str]) -> np.ndarray:
    """-> (n,) bool: the rows (windows) kept. patient_ids: (n,) one per row; multihot (n, K) {0,1}.

    Keeps max(1, round(fraction * P)) of the P patients, whole, stratified by class with
    iterative stratification (see the module docstring for the algorithm and why not label
    powerset), with every class that has a patient in the input present in the kept set.
    fraction must lie in (0, 1]; 1.0 keeps every row. The same inputs and seed give the same
    mask whatever the row order.

    Raises SubsetError for a fraction outside (0, 1], malformed inputs, or a fraction too small
    to keep every class (naming the classes, the fraction and the counts).
    """
    fraction = _check_fraction(fraction)
    uniq, inverse, labels, _ = _patients(patient_ids, multihot, class_names)
    n_rows, n_patients = inverse.size, uniq.size
    if fraction == 1.0:
        return np.ones(n_rows, dtype=bool)
    if n_patients == 0:
        raise SubsetError(f"fraction {fraction}: the training split has no rows to take a subset of")
    n_keep = max(1, round(fraction * n_patients))
    if n_keep >= n_patients:
        return np.ones(n_rows, dtype=bool)

    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_patients)                              # processing order over sorted ids
    lab = labels[perm]
    kept = _iterative_stratification(lab, n_keep, rng)
    _keep_every_class(lab, kept, n_keep, fraction, class_names)

    keep_patient = np.empty(n_patients, dtype=bool)
    keep_patient[perm] = kept
    return keep_patient[inverse]


def subset_summary(patient_ids: Sequence[str], multihot: np.ndarray, keep: np.ndarray,
                   class_names: Sequence[str]) -> dict:
    """Per-class positive-patient counts (full vs kept) and kept patients / rows, JSON-ready.

    keep: (n,) bool as returned by stratified_patient_subset; a mask that splits a patient's
    rows raises SubsetError.
    """
    uniq, inverse, labels, rows = _patients(patient_ids, multihot, class_names)
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != inverse.shape:
        raise SubsetError(f"keep has shape {keep.shape}, expected ({inverse.size},)")
    kept_rows = np.bincount(inverse, weights=keep, minlength=uniq.size)
    if not np.all((kept_rows == 0) | (kept_rows == rows)):
        raise SubsetError("keep splits the rows of a patient; a subset keeps or drops whole patients")
    kept = kept_rows > 0
    full_counts, kept_counts = labels.sum(0), labels[kept].sum(0)
    return {
        "patients_full": int(uniq.size),
        "patients_kept": int(kept.sum()),
        "fraction_patients_kept": float(kept.sum() / uniq.size) if uniq.size else 0.0,
        "rows_full": int(inverse.size),
        "rows_kept": int(keep.sum()),
        "class_patients_full": {str(n): int(c) for n, c in zip(class_names, full_counts)},
        "class_patients_kept": {str(n): int(c) for n, c in zip(class_names, kept_counts)},
    }
