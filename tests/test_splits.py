"""Patient-level splits: deterministic, ~80/10/10, disjoint, stable when records are added."""
from __future__ import annotations

from collections import Counter

import pytest

from coreecg.data.splits import SPLITS, assign_split, patient_key, unit_hash


def test_deterministic_and_dataset_scoped():
    assert assign_split("ptbxl", "123", "r1") == assign_split("ptbxl", "123", "r1")
    assert 0.0 <= unit_hash("ptbxl", "123") < 1.0
    assert unit_hash("ptbxl", "123") != unit_hash("mimic-iv-ecg", "123")  # ids are per dataset


def test_ratios_close_to_80_10_10_over_many_patients():
    n = 20000
    counts = Counter(assign_split("ptbxl", str(p), f"r{p}") for p in range(n))
    assert set(counts) == set(SPLITS)
    for split, expected in zip(SPLITS, (0.8, 0.1, 0.1)):
        assert abs(counts[split] / n - expected) < 0.01, counts


def test_custom_ratios_are_honoured():
    counts = Counter(assign_split("x", str(p), "r", (0.5, 0.0, 0.5)) for p in range(4000))
    assert counts["val"] == 0 and abs(counts["train"] / 4000 - 0.5) < 0.03


def test_no_patient_in_two_splits():
    records = [(f"p{p}", f"r{p}-{k}") for p in range(2000) for k in range(4)]
    by_patient: dict[str, set[str]] = {}
    for pid, rid in records:
        by_patient.setdefault(pid, set()).add(assign_split("cinc2021", pid, rid))
    assert all(len(s) == 1 for s in by_patient.values())


def test_adding_records_and_patients_never_moves_an_existing_patient():
    before = {p: assign_split("mimic-iv-ecg", str(p), "r") for p in range(3000)}
    after = {p: assign_split("mimic-iv-ecg", str(p), f"new-{p}") for p in range(6000)}
    assert all(after[p] == s for p, s in before.items())


@pytest.mark.parametrize("missing", [None, "", "  "])
def test_records_without_patient_id_are_their_own_patient(missing):
    assert patient_key(missing, "A0001") == "record:A0001"
    assert assign_split("cpsc2018", missing, "A0001") == assign_split("cpsc2018", "record:A0001", "other")
    # Different records of an id-less dataset are spread independently, not lumped together.
    splits = Counter(assign_split("cpsc2018", missing, f"A{i:04d}") for i in range(2000))
    assert abs(splits["train"] / 2000 - 0.8) < 0.03
