"""Fair tables (coreecg/eval/fairness.py): rows may differ only in what defines their method; any
other difference is an error naming the table, the rows and the keys, unless the variants file
declares it (`allow:`), and then it is the table's footnote. Checked by a study before Ray starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coreecg.config import OptimConfig
from coreecg.eval.fairness import FINETUNING, PRETRAINING, Allowance, Entry, UnfairTableError, check_table
from coreecg.study.spec import StudyError, load_study
from coreecg.tune.spaces import SpaceError, load_space
from tests.helpers import TINY, tiny_config

REPO = Path(__file__).resolve().parents[1]


def _pre(method: str, *overrides: str, seed: int = 0) -> Entry:
    return Entry(method, PRETRAINING, "", tiny_config(*overrides, f"train.seed={seed}").to_dict())


def test_what_defines_a_method_and_what_only_bookkeeps_may_differ():
    entries = [_pre("CoRe-ECG"),
               _pre("ST-MEM-like", "methods.core.masking.strategy=random", "methods.core.loss.beta=0",
                    "train.name=other", "train.storage_path=/elsewhere", "train.checkpoint_every_steps=7",
                    "data.probe_max_windows=9"),
               _pre("MoCo V3", "pretrain.method=moco_v3", "methods.moco_v3.dim=16", "methods.core.fda.enabled=false")]
    assert check_table("comparison", entries) == []


@pytest.mark.parametrize("override, key", [
    ("optim.lr=0.001", "optim.lr"),                       # pretraining budget and optimiser
    ("optim.epochs=3", "optim.epochs"),
    ("encoders.coreecg.depth=3", "encoders.coreecg.depth"),                  # the encoder
    # negatives
    (f"optim.gather_negatives={str(not OptimConfig().gather_negatives).lower()}", "optim.gather_negatives"),
    ("train.num_workers=4", "train.num_workers"),         # workers x per-worker batch
    ("data.corpus=/other/corpus", "data.corpus"),         # pretraining data
])
def test_an_undeclared_difference_names_the_table_rows_and_key(override, key):
    entries = [_pre("CoRe-ECG"), _pre("ST-MEM-like", "methods.core.loss.beta=0"),
               _pre("MoCo V3", "pretrain.method=moco_v3", override)]
    with pytest.raises(UnfairTableError) as err:
        check_table("comparison", entries)
    text = str(err.value)
    assert "'comparison'" in text and key in text and "MoCo V3 differs from CoRe-ECG, ST-MEM-like" in text


def test_a_declared_difference_becomes_a_footnote_and_covers_only_its_rows_and_keys():
    entries = [_pre("CoRe-ECG"), _pre("ST-MEM-like", "methods.core.loss.beta=0"),
               _pre("MoCo V3", "pretrain.method=moco_v3", "optim.lr=0.001")]
    allow = [Allowance(("MoCo V3",), ("optim.*",), "MoCo v3's own optimiser settings")]
    (note,) = check_table("comparison", entries, allow)
    assert note.startswith("MoCo V3 differs in optim.lr") and note.endswith("MoCo v3's own optimiser settings")
    with pytest.raises(UnfairTableError, match="optim.lr"):             # another row is not covered
        check_table("comparison", entries, [Allowance(("ST-MEM-like",), ("optim.*",), "x")])
    with pytest.raises(UnfairTableError, match="optim.lr"):             # another key is not covered
        check_table("comparison", entries, [Allowance(("MoCo V3",), ("optim.epochs",), "x")])


def test_fine_tuning_rows_are_compared_cell_by_cell_and_seed_sets_must_agree():
    ft = lambda m, cell, *o, seed=0: Entry(m, FINETUNING, cell, tiny_config(*o, f"train.seed={seed}").to_dict())  # noqa: E731
    same_cell = [ft("A", "ptbxl 12", "finetune.method=A"),
                 ft("B", "ptbxl 12", "finetune.method=B", "finetune.mode=scratch")]
    other_cell = [ft("A", "ptbxl 1", "finetune.leads=[I]"), ft("B", "ptbxl 1", "finetune.leads=[I]")]
    assert check_table("leads", same_cell + other_cell) == []           # leads differ between cells, not within
    with pytest.raises(UnfairTableError, match=r"fine-tuning \(ptbxl 12\): B differs from A in finetune.lr"):
        check_table("leads", [same_cell[0], ft("B", "ptbxl 12", "finetune.lr=0.01")])
    seeds = [ft("A", "c", seed=0), ft("A", "c", seed=1), ft("B", "c", seed=0)]
    with pytest.raises(UnfairTableError, match=r"seeds differ: A \[0, 1\]; B \[0\]"):
        check_table("t", seeds)
    assert check_table("t", seeds, seeds="note") == ["fine-tuning (c): seeds differ: A [0, 1]; B [0]"]


def test_every_run_of_a_row_is_compared_not_only_its_first():
    runs = [_pre("CoRe-ECG", seed=0), _pre("CoRe-ECG", "optim.epochs=3", seed=1),
            _pre("ST-MEM-like", "methods.core.loss.beta=0", seed=0),
            _pre("ST-MEM-like", "methods.core.loss.beta=0", seed=1)]
    with pytest.raises(UnfairTableError, match=r"CoRe-ECG's runs differ among themselves in optim.epochs"):
        check_table("comparison", runs)
    (note,) = check_table("comparison", runs, [Allowance(("CoRe-ECG",), ("optim.epochs",), "a longer rerun")])
    assert note.startswith("CoRe-ECG's runs differ among themselves in optim.epochs")
    assert note.endswith("a longer rerun")
    with pytest.raises(UnfairTableError, match="differ among themselves"):      # a table of one row too
        check_table("one row", runs[:2])


def _variants(tmp_path: Path, moco: list[str], allow: list | None = None) -> Path:
    data = {"variants": {"CoRe-ECG": [],
                         "ST-MEM-like": ["methods.core.masking.strategy=random", "methods.core.masking.ratio=0.75",
                                         "methods.core.loss.beta=0"],
                         "MoCo V3": ["pretrain.method=moco_v3", *moco], "Supervised": "scratch"},
            "tables": {"comparison": ["Supervised", "MoCo V3", "ST-MEM-like", "CoRe-ECG"]}}
    if allow is not None:
        data["allow"] = allow
    path = tmp_path / "variants.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _study(tmp_path: Path, variants: Path, ecg_data: Path) -> Path:
    data = {"config": str(REPO / "configs" / "quickstart.yaml"),
            "set": [*TINY, f"data.cache_dir={tmp_path / 'cache'}"],
            "variants": str(variants),
            "pretrain": {"methods": ["CoRe-ECG", "ST-MEM-like", "MoCo V3"], "seeds": [0, 1]},
            "downstream": {"corpora": {"ptbxl": {"source": "ptbxl", "input": str(ecg_data / "ptbxl")}},
                           "seeds": [0, 1]},
            "report": {"tables": ["comparison"]}}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_study_with_an_undeclared_difference_stops_before_ray_and_a_declared_one_runs(tmp_path, ecg_data):
    study = _study(tmp_path, _variants(tmp_path, ["optim.batch_size=64"]), ecg_data)
    with pytest.raises(StudyError) as err:
        load_study(study)
    assert str(study) in str(err.value) and "'comparison'" in str(err.value)
    assert "MoCo V3 differs from CoRe-ECG, ST-MEM-like in optim.batch_size" in str(err.value)
    done = subprocess.run([sys.executable, "jobs/study.py", str(study), "--output", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "optim.batch_size" in done.stderr and not (tmp_path / "out").exists()
    allow = [{"variants": ["MoCo V3"], "keys": ["optim.batch_size"], "reason": "MoCo v3 needs a large batch"}]
    loaded = load_study(_study(tmp_path, _variants(tmp_path, ["optim.batch_size=64"], allow), ecg_data))
    assert [a.reason for a in loaded.allow] == ["MoCo v3 needs a large batch"]
    assert loaded.table_rows() == {"comparison": ["Supervised", "MoCo V3", "ST-MEM-like", "CoRe-ECG"]}


@pytest.mark.parametrize("entry, message", [
    ({"variants": ["MoCo v3"], "keys": ["optim.lr"], "reason": "r"}, "unknown variants"),
    ({"variants": ["MoCo V3"], "keys": ["optim.learning_rate"], "reason": "r"}, "not a config key"),
    ({"variants": ["MoCo V3"], "keys": ["methods.core.masking.ratio"], "reason": "r"}, "defines a method"),
    ({"variants": ["MoCo V3"], "keys": ["optim.lr"], "reason": " "}, "must give the reason"),
])
def test_a_bad_allow_entry_names_the_file_and_the_entry(tmp_path, entry, message):
    path = _variants(tmp_path, [], [entry])
    with pytest.raises(SpaceError, match=message) as err:
        load_space(path)
    assert str(path) in str(err.value) and "allow" in str(err.value)


def _finished(tmp_path: Path, method: str, seed: int, *overrides: str) -> Path:
    """A finished fine-tuning run folder (calibration's synthetic predictions) with its config.yaml."""
    import numpy as np

    from coreecg.eval.calibration import _test_set, write_run

    task = _test_set(40, np.random.default_rng(0))
    folder = write_run(tmp_path / "runs" / f"{method}-s{seed}", method, seed, task,
                       np.random.default_rng(seed).normal(size=task[2].shape) + 2 * task[2])
    tiny_config(*overrides, f"train.seed={seed}", f"finetune.method={method}").to_yaml(folder / "config.yaml")
    return folder


def test_the_report_refuses_rows_trained_differently_and_footnotes_a_declared_difference(tmp_path):
    runs = [_finished(tmp_path, "CoRe-ECG", s) for s in (0, 1)]
    runs += [_finished(tmp_path, "MoCo V3", s, "finetune.epochs=3") for s in (0, 1)]
    args = [sys.executable, "jobs/report.py", *map(str, runs), "--set", "report.reference=CoRe-ECG"]
    done = subprocess.run([*args, "--output", str(tmp_path / "t1")], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert "'comparison'" in done.stderr and "MoCo V3 differs from CoRe-ECG in finetune.epochs" in done.stderr
    assert not (tmp_path / "t1" / "comparison.md").exists()
    variants = _variants(tmp_path, [], [{"variants": ["MoCo V3"], "keys": ["finetune.epochs"],
                                         "reason": "a shorter schedule, stated in the paper"}])
    done = subprocess.run([*args, "--output", str(tmp_path / "t2"), "--variants", str(variants)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "t2" / "comparison.md").read_text()
    assert "Protocol: MoCo V3 differs in finetune.epochs" in table and "stated in the paper" in table
    assert "stated in the paper" in (tmp_path / "t2" / "comparison.tex").read_text()


# What defined a method before the methods declared it (7162f21's hard-coded lists): every
# built-in method's keys must classify exactly as they did.
_OLD_PREFIXES = ("pretrain.", "methods.", "masking.", "augment.", "model.time_decoder_", "model.latent_decoder_",
                 "model.proj_", "methods.core.ema.momentum")
_OLD_KEYS = {"methods.core.loss.alpha", "methods.core.loss.beta", "methods.core.loss.tau", "train.variant",
             "finetune.method", "finetune.mode", "finetune.encoder"}


def test_defining_keys_come_from_the_registrations_and_classify_every_key_as_before():
    from coreecg.eval.fairness import BOOKKEEPING, BOOKKEEPING_PREFIXES, flatten, is_compared

    keys = {k for m in ("core", "moco_v3", "cmsc") for k in flatten(tiny_config(f"pretrain.method={m}").to_dict())}
    old = {k: not (k in _OLD_KEYS or k in BOOKKEEPING or k.startswith(_OLD_PREFIXES + BOOKKEEPING_PREFIXES))
           for k in keys}
    assert {k: is_compared(k) for k in keys} == old
    # CoRe-ECG's own
    assert not is_compared("methods.core.masking.p_time") and not is_compared("methods.core.time_decoder.depth")
    assert is_compared("encoders.coreecg.depth") and is_compared("optim.lr")
    # how a step is run (compiled, CUDA graphs) changes its speed, not what it computes
    assert not is_compared("train.compile") and not is_compared("train.compile_mode")


def test_a_registered_methods_defining_keys_join_the_union_and_a_bad_one_is_refused():
    from coreecg.config import ConfigError, method_specs
    from coreecg.methods import PretrainMethod, register_method

    rows = [_pre("CoRe-ECG"), _pre("Decayed", "optim.weight_decay=0.5")]
    with pytest.raises(UnfairTableError, match="optim.weight_decay"):
        check_table("comparison", rows)
    try:
        register_method("decayed_test", defining=("optim.weight_decay",))(type("Decayed", (PretrainMethod,), {}))
        assert check_table("comparison", rows) == []          # now a key that defines a method
    finally:
        method_specs().pop("decayed_test", None)
    with pytest.raises(UnfairTableError, match="optim.weight_decay"):
        check_table("comparison", rows)
    with pytest.raises(ConfigError, match=r"'bad_test': defining key\(s\) \['optim\.wieght_decay'\] name no config"):
        register_method("bad_test", defining=("optim.wieght_decay",))(type("Bad", (PretrainMethod,), {}))
    assert "bad_test" not in method_specs()
