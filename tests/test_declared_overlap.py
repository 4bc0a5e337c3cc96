"""Declared overlap (coreecg.data.declared): a published family's declared pretraining databases held
against the downstream corpus's, marked in the run's leakage entry, its report note and table legend,
and the export's model card."""
from __future__ import annotations

import json

from coreecg.data.declared import MARK, declared_note, declared_overlap, downstream_databases
from coreecg.eval.runs import leakage_note
from coreecg.hub.card import _published_lines
from coreecg.train.leakage_guard import Pretraining, check_overlap


def test_containment_and_subsets():
    # ECG-FM's fine-tuned weights: PhysioNet/CinC 2021, which contains PTB-XL
    assert declared_overlap(("mimic_iv_ecg", "cinc2021"), {"source": "ptbxl"}) == ["ptbxl"]
    assert declared_overlap(("mimic-iv-ecg",), {"source": "ptbxl"}) == []
    assert declared_overlap(("mimic-iv-ecg",), {"source": "mimic-iv-ecg"}) == ["mimic_iv_ecg"]
    ningbo = {"source": "cinc2021", "source_options": {"subsets": ["Ningbo"]}}
    assert downstream_databases(ningbo) == {"ningbo"}
    assert declared_overlap(("cinc2021",), ningbo) == ["ningbo"]
    assert declared_overlap(("ptbxl",), ningbo) == []
    # a CinC 2021 corpus of every database overlaps weights declared on any one of them
    assert declared_overlap(("chapman",), {"source": "cinc2021"}) == ["chapman"]


def test_the_guard_records_it_and_the_report_and_card_say_it(tmp_path):
    corpus = tmp_path / "ptbxl-corpus"
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps({"source": "ptbxl", "source_options": {}}))
    pre = Pretraining(None, note="published ECG-FM weights", declared=("mimic_iv_ecg", "cinc2021"), family="ECG-FM")
    entry, overlap = check_overlap(pre, corpus, allow=False)      # marked, not refused: nothing to compare here
    assert overlap is None and entry["declared"] == {"family": "ECG-FM", "pretrained_on": ["mimic_iv_ecg",
                                                                                          "cinc2021"],
                                                     "databases": ["ptbxl"]}
    note = leakage_note({"leakage": entry})
    assert note.startswith(MARK) and "ptbxl" in note and "ECG-FM" in note
    # no declared database downstream: no mark
    clean = Pretraining(None, note="", declared=("mimic_iv_ecg",), family="MERL")
    entry, _ = check_overlap(clean, corpus, allow=False)
    assert entry["declared"]["databases"] == [] and leakage_note({"leakage": entry}) == ""
    assert declared_note(None) == ""
    enc = {"family": "HuBERT-ECG", "arch": "hubert_ecg", "licence": "CC BY-NC 4.0", "commercial_use": False,
           "pretraining": "9 databases", "pretrained_on": ["ptbxl", "code15"]}
    card = "\n".join(_published_lines(enc, {"corpus": {"source": "ptbxl"}}))
    assert "non-commercial" in card and f"**{MARK}**" in card and "ptbxl" in card
    card = "\n".join(_published_lines({**enc, "commercial_use": True}, {"corpus": {"source": "mimic-iv-ecg"}}))
    assert "non-commercial" not in card and "declared overlap with the fine-tuning corpus: none" in card


def test_a_verdict_says_the_rows_declared_overlap():
    """The label-efficiency verdict of a row whose runs carry a declared overlap says so."""
    from types import SimpleNamespace

    from coreecg.eval.tables import label_efficiency as le

    row = SimpleNamespace(name="fm-linear", method="ECG-FM", role="pretrained", mode="linear", baseline="rnd")
    base = SimpleNamespace(name="rnd", method="Random init", role="baseline", mode="linear", baseline=None)
    column = SimpleNamespace(metric=le.VERDICT_METRIC, dataset="ptbxl", leads="12", fraction=1.0)
    table = SimpleNamespace(rows=[base, row], columns=[column], members={"fm-linear": {("ptbxl", "12", 1.0)}},
                            leaks={"ECG-FM": [f"ptbxl, seed 0: {MARK}: ECG-FM weights declare ... ptbxl"]},
                            difference=lambda name, j: "its runs have no predictions")
    (verdict,) = le.verdicts(table)
    assert f"{MARK}: its weights declare data that contains this dataset" in verdict
    table.leaks = {}
    assert MARK not in le.verdicts(table)[0]
