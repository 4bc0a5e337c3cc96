"""A pretraining corpus built without the downstream val/test records (build_corpus's
exclude_overlap_with, jobs/preprocess.py --exclude-overlap-with; docs/leakage.md), on the real
shared data read in place: the MIMIC-layout folder holds 60 PTB-XL records under MIMIC names,
cinc2021-smoke PTB-XL records 1-10 as HR00001-HR00010 among other databases' records
(../shared/ecg-data/cinc2021's HR06000-HR06009 are not in the shared PTB-XL subset). Which record
is which PTB-XL record comes from the guard's own report on a corpus built without the exclusion,
never from a hard-coded table."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from coreecg.config import load_config
from coreecg.data.corpus import MANIFEST, QUARANTINE, load_manifest, verify_corpus
from coreecg.data.fingerprints import FINGERPRINT_FILE, corpus_fingerprints, is_current
from coreecg.data.overlap import GUARDED_SPLITS, LeakageError, compare
from coreecg.data.exclusion import load_downstream
from coreecg.data.pipeline import build_corpus
from coreecg.files import sha256_file
from coreecg.train.leakage_guard import Pretraining, check_overlap
from tests.helpers import build_ptbxl

MIMIC = "mimic-iv-ecg"
TAIL = "; leakage guard; excluded from pretraining)"


def _ids(corpus: Path) -> set[str]:
    """Every record id of a corpus, all splits (its fingerprint file holds one row per stored window)."""
    return set(corpus_fingerprints(corpus).column("record_id").to_pylist())


def _twins(plain: Path, ptbxl: Path) -> dict[str, tuple[str, str]]:
    """{record of `plain`: (its PTB-XL twin, the twin's split)} from the guard's comparison of all splits."""
    pairs = compare(corpus_fingerprints(plain), corpus_fingerprints(ptbxl), str(plain), str(ptbxl)).pairs
    return {r.a_record: (r.b_record, r.b_split) for r in pairs.itertuples()}


def _quarantine(corpus: Path) -> dict[str, str]:
    with open(corpus / QUARANTINE, newline="") as f:
        return {row["record_id"]: row["reason"] for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def built(ray_session, ecg_data, tmp_path_factory):
    """ptbxl (downstream), the MIMIC layout and CinC 2021 (smoke) each built without and with the exclusion."""
    root = tmp_path_factory.mktemp("excl")
    ptbxl = build_ptbxl(root, ecg_data)
    cfg = load_config(overrides=["data.shard_records=32"]).data          # 2 shards: filtered shard by shard
    out = {"root": root, "ptbxl": ptbxl, "cfg": cfg}
    for name, source, folder, options in (("mimic", MIMIC, "mimic-iv-ecg-layout", {}),
                                          ("cinc", "cinc2021", "cinc2021-smoke", {"class_map": "none"})):
        for kind, exclude in (("plain", ()), ("excl", (ptbxl,))):
            out[f"{name}-{kind}"] = root / f"{name}-{kind}"
            out[f"{name}-{kind}-result"] = build_corpus(source, ecg_data / folder, root / f"{name}-{kind}", cfg,
                                                        source_options=options, exclude_overlap_with=exclude)
    return out


@pytest.mark.parametrize("name", ["mimic", "cinc"])
def test_removed_records_are_exactly_those_whose_twin_is_in_val_or_test(built, name):
    plain, excl = built[f"{name}-plain"], built[f"{name}-excl"]
    twins = _twins(plain, built["ptbxl"])
    guarded = {a for a, (_, split) in twins.items() if split in GUARDED_SPLITS}
    trained = {a for a, (_, split) in twins.items() if split == "train"}
    assert guarded and trained, f"{name}: the shared data no longer has twins in both train and val/test"
    kept = _ids(excl)
    assert kept == _ids(plain) - guarded
    assert trained <= kept            # a twin in PTB-XL's train split is no leak: it stays
    quarantine = _quarantine(excl)
    assert set(quarantine) - set(_quarantine(plain)) == guarded
    for rid in guarded:
        twin, split = twins[rid]
        assert quarantine[rid].startswith(f"shares a recording with a val/test record of ptbxl ({built['ptbxl']} "
                                          f"{split} record {twin}; ")
        assert quarantine[rid].endswith(TAIL)


def test_manifest_shards_and_fingerprints_are_consistent(built):
    excl, plain = built["mimic-excl"], built["mimic-plain"]
    m, p = load_manifest(excl), load_manifest(plain)
    removed = len(_ids(plain) - _ids(excl))
    assert m["excluded_overlap_with"] == {
        "downstream": [load_downstream([built["ptbxl"]], excl)[0].identity],
        "splits": list(GUARDED_SPLITS), "records_removed": removed, "windows_removed": removed,
        "by_downstream": {str(built["ptbxl"]): removed}}
    assert "excluded_overlap_with" not in p       # a corpus built without it is as before
    c = m["counts"]
    assert c["records_listed"] == c["records_written"] + c["records_quarantined"] == 60
    assert c["records_written"] == p["counts"]["records_written"] - removed
    assert sum(c["quarantine_reasons"].values()) == c["records_quarantined"]
    assert len(c["quarantine_reasons"]) == 1      # one kind per downstream corpus, not one per record
    assert verify_corpus(excl) == []
    assert sum(s["rows"] for s in m["shards"]) == c["windows_total"] == corpus_fingerprints(excl).num_rows
    assert is_current(excl)
    assert built["mimic-excl-result"]["run"]["stale_files_removed"] == []


def test_the_guard_passes_after_the_exclusion(built):
    """check_overlap (A's train split against B's val/test) refuses the MIMIC layout built plainly
    (twins of val/test records sit in its train split) and passes both excluded corpora; compared
    split by split in full, no record of an excluded corpus matches a val/test record any more."""
    with pytest.raises(LeakageError, match="share a patient"):
        check_overlap(Pretraining(str(built["mimic-plain"])), built["ptbxl"], allow=False)
    for name in ("mimic", "cinc"):
        entry, overlap = check_overlap(Pretraining(str(built[f"{name}-excl"])), built["ptbxl"], allow=False)
        assert entry["checked"] and not entry["overlap"] and overlap is None
        down = corpus_fingerprints(built["ptbxl"])
        assert compare(corpus_fingerprints(built[f"{name}-plain"]), down, "a", "b", splits=GUARDED_SPLITS).counts[
            "b_records"] > 0
        assert compare(corpus_fingerprints(built[f"{name}-excl"]), down, "a", "b", splits=GUARDED_SPLITS).counts[
            "b_records"] == 0


def test_rerun_through_the_job_is_idempotent(built, capsys):
    from jobs.preprocess import main

    excl = built["mimic-excl"]
    before = {f.name: sha256_file(f) for f in (excl / MANIFEST, excl / QUARANTINE, excl / FINGERPRINT_FILE)}
    rc = main(["--source", MIMIC, "--input", str(Path(load_manifest(excl)["input"])), "--output", str(excl),
               "--exclude-overlap-with", str(built["ptbxl"]), "--set", "data.shard_records=32"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["shards_skipped"] == summary["shards"] == 2
    assert summary["excluded_overlap_with"]["records_removed"] == load_manifest(excl)["excluded_overlap_with"][
        "records_removed"]
    # the manifest's bytes (hence the fingerprints' stamp) are those of the first build
    assert {f.name: sha256_file(f) for f in (excl / MANIFEST, excl / QUARANTINE, excl / FINGERPRINT_FILE)} == before


def test_an_interrupted_build_resumes_to_the_same_corpus(built, ecg_data):
    """A build killed after its first shard (the second shard's files and marker, the manifest and
    the fingerprints not yet written) resumes with the same exclusion into the same corpus."""
    import shutil

    excl, resumed = built["mimic-excl"], built["root"] / "mimic-resumed"
    shutil.copytree(excl, resumed)
    for f in [resumed / MANIFEST, resumed / FINGERPRINT_FILE, resumed / "_state" / "shard-00001.json",
              *resumed.glob("*/shard-00001.parquet")]:
        f.unlink()
    result = build_corpus(MIMIC, ecg_data / "mimic-iv-ecg-layout", resumed, built["cfg"],
                          exclude_overlap_with=[built["ptbxl"]])
    assert result["run"]["shards_skipped"] == 1
    assert load_manifest(resumed) == load_manifest(excl)
    assert _quarantine(resumed) == _quarantine(excl)


def test_a_finished_corpus_asked_with_another_exclusion_is_an_error(built, ecg_data):
    cfg, ptbxl, layout = built["cfg"], built["ptbxl"], ecg_data / "mimic-iv-ecg-layout"
    cases = [  # (folder, asked now, what the message says it was built with)
        (built["mimic-plain"], [ptbxl], "excluding the val/test records of no downstream corpus"),
        (built["mimic-excl"], [], f"excluding the val/test records of {ptbxl} "),
        (built["mimic-excl"], [ptbxl, built["cinc-plain"]],
         f"exclude those of {built['cinc-plain']} (val/test records sha256"),
    ]
    for folder, asked, says in cases:
        before = sha256_file(folder / MANIFEST)
        with pytest.raises(ValueError, match="a finished corpus built") as e:
            build_corpus(MIMIC, layout, folder, cfg, exclude_overlap_with=asked)
        assert str(folder) in str(e.value) and says in str(e.value), str(e.value)
        assert sha256_file(folder / MANIFEST) == before          # nothing rewritten


def test_a_downstream_folder_that_is_no_corpus_is_an_error(built, ecg_data, capsys):
    from jobs.preprocess import main

    raw = ecg_data / "ptbxl"                      # the raw records, not a built corpus
    with pytest.raises(ValueError, match=f"exclude_overlap_with {raw}: not a built corpus"):
        build_corpus(MIMIC, ecg_data / "mimic-iv-ecg-layout", built["root"] / "never", built["cfg"],
                     exclude_overlap_with=[raw])
    assert not (built["root"] / "never").exists()
    rc = main(["--source", MIMIC, "--input", str(ecg_data / "mimic-iv-ecg-layout"),
               "--output", str(built["root"] / "never"), "--exclude-overlap-with", str(raw)])
    assert rc == 2 and f"{raw}: not a built corpus" in capsys.readouterr().err
    with pytest.raises(ValueError, match="that is the corpus being built"):
        build_corpus(MIMIC, ecg_data / "mimic-iv-ecg-layout", built["ptbxl"], built["cfg"],
                     exclude_overlap_with=[built["ptbxl"]])


def test_help_names_the_flag(capsys):
    from jobs.preprocess import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--exclude-overlap-with CORPUS" in out and "val/test" in out
