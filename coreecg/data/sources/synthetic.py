"""A seeded generator of physiologically shaped 12-lead ECG: the platform's embedded corpus.

Model: a 3-D heart dipole d(t) (x: patient's left, y: inferior, z: anterior) built beat by
beat from Gaussian waves P, Q, R, S, T (each a 3-vector amplitude times a Gaussian in time).
Electrode potentials are projections of d(t) on electrode vectors plus per-electrode baseline
wander and noise; the 12 leads are then DERIVED from electrodes exactly as an ECG machine does:

    I = LA - RA,  II = LL - RA,  III = LL - LA
    aVR = RA - (LA+LL)/2,  aVL = LA - (RA+LL)/2,  aVF = LL - (RA+LA)/2
    Vi  = phi_Vi - (RA+LA+LL)/3   (Wilson central terminal)

so Einthoven (II = I + III) and Goldberger (aVR = -(I+II)/2, aVL = I - II/2, aVF = II - I/2)
hold to float rounding, noise included.

Classes (one per patient; each patient has `RECORDS_PER_PATIENT` records, so patient-level
splits are meaningful and classes stay balanced to within one patient):
    normal_sinus        60-100 bpm, small RR variability
    sinus_bradycardia   40-58 bpm
    sinus_tachycardia   102-150 bpm
    atrial_fibrillation irregular RR (CV 0.15-0.3), no P wave, 4-9 Hz fibrillatory baseline
    bundle_branch_block QRS about 2.5x wider with a late R' (RSR' in V1)
    st_elevation        an ST-segment vector toward the anterior leads (V1-V4 elevated)

Record i of seed s depends only on (s, i), so any subset is reproducible on its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coreecg.data.record import STANDARD_LEADS, Record, RecordError, RecordRef
from coreecg.data.sources.registry import register_source

CLASS_NAMES: tuple[str, ...] = (
    "normal_sinus", "sinus_bradycardia", "sinus_tachycardia",
    "atrial_fibrillation", "bundle_branch_block", "st_elevation",
)
RECORDS_PER_PATIENT = 3

# Electrode directions in (x, y, z); limb electrodes form Einthoven's equilateral triangle.
_LIMB = np.array([[-0.5, -0.29, 0.0],   # RA
                  [0.5, -0.29, 0.0],    # LA
                  [0.0, 0.58, 0.0]])    # LL
_PRECORDIAL_DEG = np.array([115.0, 95.0, 75.0, 60.0, 30.0, 0.0])  # V1..V6, from left toward anterior
_PRECORDIAL = 1.5 * np.stack([np.cos(np.radians(_PRECORDIAL_DEG)),
                              np.full(6, 0.15),
                              np.sin(np.radians(_PRECORDIAL_DEG))], axis=1)
_ELECTRODES = np.concatenate([_LIMB, _PRECORDIAL])  # (9, 3): RA, LA, LL, V1..V6

# Wave templates: (name, amplitude vector in mV, time offset from R in s, width sigma in s).
_WAVES = (
    ("P", np.array([0.5, 0.8, 0.1]) * 0.18, -0.16, 0.022),
    ("Q", np.array([-0.7, 0.1, 0.7]) * 0.25, -0.028, 0.010),
    ("R", np.array([0.55, 0.8, -0.25]) * 1.3, 0.0, 0.011),
    ("S", np.array([-0.3, -0.5, -0.6]) * 0.45, 0.028, 0.012),
    ("T", np.array([0.6, 0.7, 0.25]) * 0.35, 0.28, 0.045),
)


def _rotation(rng: np.random.Generator, max_deg: float) -> np.ndarray:
    """A small random 3-D rotation: patients differ in heart axis."""
    ax, ay, az = np.radians(rng.uniform(-max_deg, max_deg, 3))
    rx = np.array([[1, 0, 0], [0, np.cos(ax), -np.sin(ax)], [0, np.sin(ax), np.cos(ax)]])
    ry = np.array([[np.cos(ay), 0, np.sin(ay)], [0, 1, 0], [-np.sin(ay), 0, np.cos(ay)]])
    rz = np.array([[np.cos(az), -np.sin(az), 0], [np.sin(az), np.cos(az), 0], [0, 0, 1]])
    return rz @ ry @ rx


def _beat_times(rng: np.random.Generator, label: int, duration_s: float) -> np.ndarray:
    """R-peak times (s) covering [-1, duration + 1] so edge beats are complete."""
    hr = {0: (60, 100), 1: (40, 58), 2: (102, 150), 3: (70, 140), 4: (60, 95), 5: (60, 100)}[label]
    rr_mean = 60.0 / rng.uniform(*hr)
    n = int((duration_s + 2) / (rr_mean * 0.5)) + 2
    if label == 3:  # AF: independent, highly irregular intervals
        cv = rng.uniform(0.15, 0.3)
        rr = rng.gamma(1 / cv**2, rr_mean * cv**2, n).clip(0.3, 2.0)
    else:          # sinus: respiratory sinus arrhythmia plus small jitter
        k = np.arange(n)
        rsa = 0.04 * np.sin(2 * np.pi * k * rr_mean / rng.uniform(3.5, 6.0) + rng.uniform(0, 2 * np.pi))
        rr = rr_mean * (1 + rsa + rng.normal(0, 0.015, n))
    t = -1.0 + rng.uniform(0, rr_mean) + np.concatenate([[0.0], np.cumsum(rr[:-1])])
    return t[t < duration_s + 1.0]


def _dipole(rng: np.random.Generator, label: int, t: np.ndarray, beats: np.ndarray) -> np.ndarray:
    """Heart dipole (3, n_samples) in mV for the given R-peak times."""
    rot = _rotation(rng, 15.0)
    scale = rng.uniform(0.7, 1.3)
    rr = np.diff(beats, append=beats[-1] + np.median(np.diff(beats)))
    d = np.zeros((3, t.size))
    waves = list(_WAVES)
    if label == 4:  # wide QRS and a late rightward-anterior R'
        waves = [(n, a, off * 2.5, s * 2.5) if n in "QRS" else (n, a, off, s) for n, a, off, s in waves]
        waves.append(("R'", np.array([-0.5, -0.1, 0.8]) * 0.6, 0.11, 0.02))
    if label == 5:  # injury current: a broad ST vector toward the anterior leads
        waves.append(("ST", np.array([0.1, 0.2, 0.95]) * rng.uniform(0.25, 0.45), 0.15, 0.06))
    for name, amp, off, sigma in waves:
        if name == "P" and label == 3:
            continue  # AF has no organised atrial depolarisation
        if name in ("T", "ST"):
            off = off * np.sqrt(rr)[:, None]  # QT shortens with heart rate (Bazett)
        centres = beats[:, None] + off
        shape = np.exp(-0.5 * ((t[None, :] - centres) / sigma) ** 2).sum(axis=0)
        d += (rot @ (amp * rng.uniform(0.85, 1.15)))[:, None] * shape[None, :]
    if label == 3:  # fibrillatory f-waves along the atrial axis, 4-9 Hz with drifting frequency
        f = rng.uniform(4, 9) + 0.5 * np.sin(2 * np.pi * 0.2 * t)
        phase = 2 * np.pi * np.cumsum(f) * (t[1] - t[0])
        d += np.array([0.5, 0.8, 0.3])[:, None] * rng.uniform(0.04, 0.1) * np.sin(phase)[None, :]
    return scale * d


def synthesize_record(seed: int, index: int, fs: float = 500.0, duration_s: float = 10.0) -> Record:
    """Record `index` of the synthetic corpus `seed`: (12, fs*duration_s) float32 mV, 12 leads."""
    patient = index // RECORDS_PER_PATIENT
    label = patient % len(CLASS_NAMES)
    rng = np.random.default_rng([seed, index])
    t = np.arange(int(round(fs * duration_s))) / fs
    d = _dipole(rng, label, t, _beat_times(rng, label, duration_s))
    phi = _ELECTRODES @ d                                              # (9, n) electrode potentials
    n_el = phi.shape[0]
    wander_f = rng.uniform(0.05, 0.5, (n_el, 2))
    wander = (rng.uniform(0.05, 0.3, (n_el, 2))[:, :, None]
              * np.sin(2 * np.pi * wander_f[:, :, None] * t + rng.uniform(0, 2 * np.pi, (n_el, 2, 1)))).sum(1)
    mains = rng.uniform(0, 0.02) * np.sin(2 * np.pi * rng.choice([50.0, 60.0]) * t)
    phi = phi + wander + mains + rng.normal(0, rng.uniform(0.005, 0.03), phi.shape)
    ra, la, ll, chest = phi[0], phi[1], phi[2], phi[3:]
    leads = np.stack([la - ra, ll - ra, ll - la,
                      ra - (la + ll) / 2, la - (ra + ll) / 2, ll - (ra + la) / 2,
                      *(chest - (ra + la + ll) / 3)])
    rid = f"syn{seed}-{index:06d}"
    return Record(source="synthetic", record_id=rid, signal=leads.astype(np.float32), fs=float(fs),
                  lead_names=STANDARD_LEADS, patient_id=f"syn{seed}-p{patient:05d}",
                  labels=(CLASS_NAMES[label],), path=f"synthetic://{seed}/{index}",
                  meta={"seed": seed, "index": index})


def synthesize(n_records: int, seed: int, fs: float = 500.0, duration_s: float = 10.0) -> list[Record]:
    """Records 0..n_records-1 of the synthetic corpus `seed`."""
    return [synthesize_record(seed, i, fs, duration_s) for i in range(n_records)]


@dataclass
class SyntheticOptions:
    """The config section data.sources.synthetic (was data.sources.synthetic_seed)."""

    seed: int = 0

    def reader_options(self, data: Any) -> dict[str, Any]:
        """The embedded corpus's size is data.synthetic_records."""
        return {"n_records": data.synthetic_records, "seed": self.seed}


@register_source("synthetic", options=SyntheticOptions)
class SyntheticSource:
    """The Source interface over the generator; needs no files.

    `list_records(root)` ignores `root` (there is nothing on disk) and lists `n_records` refs
    "synthetic://{seed}/{i}"; `read(ref)` regenerates record i. Both are deterministic.
    """

    name = "synthetic"
    class_names = CLASS_NAMES
    multilabel = False
    needs_input = False               # jobs/preprocess.py asks no --input of it

    def __init__(self, n_records: int = 512, seed: int = 0, fs: float = 500.0, duration_s: float = 10.0):
        if n_records < 1:
            raise ValueError(f"synthetic: n_records={n_records} must be >= 1")
        self.n_records, self.seed, self.fs, self.duration_s = int(n_records), int(seed), float(fs), float(duration_s)

    def list_records(self, root: Path | str | None = None) -> list[RecordRef]:
        return [RecordRef(source=self.name, record_id=f"syn{self.seed}-{i:06d}",
                          path=f"synthetic://{self.seed}/{i}",
                          extra={"seed": self.seed, "index": i, "fs": self.fs, "duration_s": self.duration_s})
                for i in range(self.n_records)]

    def read(self, ref: RecordRef) -> Record:
        try:
            seed, index = int(ref.extra["seed"]), int(ref.extra["index"])
        except (KeyError, TypeError, ValueError):
            raise RecordError(ref.path, "not a synthetic record ref (needs extra seed and index)") from None
        return synthesize_record(seed, index, float(ref.extra.get("fs", self.fs)),
                                 float(ref.extra.get("duration_s", self.duration_s)))
