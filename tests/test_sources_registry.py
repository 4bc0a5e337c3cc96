"""The source registry (coreecg/data/sources/registry.py): what `register_source` carries and the
public API that replaced six places (issue 42, must-have 1). The expected values below are what
the replaced code returned at 7162f21: `coreecg.inference.source_options`,
`coreecg.train.finetuning.dataset_name`, `coreecg.eval.report.DATASETS` / `DATASET_ALIASES`,
`wfdb_generic.KNOWN_LAYOUTS` and `SourceOptions.for_source`."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest

from coreecg.config import ConfigError, load_config
from coreecg.data.sources import (
    SOURCES, IndexFile, dataset_aliases, dataset_key, dataset_label, dataset_labels, get_source, label_free_options,
    layout_source, reader_options, register_source, source_spec,
)
from coreecg.data.sources import registry

BUILT_IN = ["ptbxl", "cpsc2018", "cinc2021", "mimic-iv-ecg", "code15", "wfdb", "synthetic",
            "dicom", "muse", "aecg", "edf", "arrays", "auto"]


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in the test are gone after it."""
    monkeypatch.setattr(registry, "SOURCES", dict(registry.SOURCES))
    monkeypatch.setattr(registry, "_INDEX_FILES", copy.deepcopy(registry._INDEX_FILES))
    return registry


@pytest.fixture
def built_ins_only(scratch_registry):
    """The registry as a process that imported no plugin sees it (other tests import some)."""
    for name in [n for n in scratch_registry.SOURCES if n not in BUILT_IN]:
        del scratch_registry.SOURCES[name]
    return scratch_registry


# ---------------------------------------------------------------------------- the six places, now one


def test_every_built_in_is_registered_from_its_own_module():
    assert list(SOURCES)[:len(BUILT_IN)] == BUILT_IN
    for name in BUILT_IN:
        spec = source_spec(name)
        assert spec.cls.__module__.startswith("coreecg.data.sources.") and get_source(name).name == name
    with pytest.raises(ValueError,
                       match=r"unknown source 'ptb-xl'; known: aecg, arrays, auto, cinc2021, code15, .*plugins"):
        source_spec("ptb-xl")


def test_label_free_options_are_todays_inference_source_options(built_ins_only):
    exports = {name: {"labels": "", "class_map": ""} for name in ("dicom", "muse", "aecg", "edf", "arrays", "auto")}
    assert label_free_options() == {"ptbxl": {"label_view": "none", "rate": 500}, "cpsc2018": {"label_view": "none"},
                                    "mimic-iv-ecg": {}, **exports}
    config = load_config(overrides=["data.sources.ptbxl.rate=100", "data.sources.ptbxl.label_view=multi"])
    assert label_free_options(config)["ptbxl"] == {"label_view": "none", "rate": 100}   # the config's rate
    for name, options in label_free_options(config).items():
        if name in BUILT_IN:
            assert get_source(name, **options).class_names == ()          # a view without labels


@pytest.mark.parametrize("manifest, key", [
    ({"source": "ptbxl", "source_options": {"task": "superdiagnostic"}}, "ptbxl"),
    ({"source": "ptbxl", "source_options": None}, "ptbxl"),
    ({"source": "ptbxl", "source_options": {"task": "rhythm"}}, "ptbxl-rhythm"),
    ({"source": "ptbxl", "source_options": {}, "split_rule": "folds"}, "ptbxl-folds"),
    ({"source": "ptbxl", "source_options": {"task": "form"}, "split_rule": "folds"}, "ptbxl-form-folds"),
    ({"source": "cinc2021", "source_options": {"subsets": ["Ningbo"]}}, "ningbo"),
    ({"source": "cinc2021", "source_options": {"subsets": ["Chapman-Shaoxing"]}}, "chapman-shaoxing"),
    ({"source": "cinc2021", "source_options": {"subsets": ["Ningbo", "Georgia"]}}, "cinc2021"),
    ({"source": "cinc2021", "source_options": {"subsets": None}}, "cinc2021"),
    ({"source": "cpsc2018", "source_options": {"label_view": "first"}}, "cpsc2018"),
    ({"source": "mimic-iv-ecg"}, "mimic-iv-ecg"),
    ({"source": "code15"}, "code15"),
    ({"source": "synthetic"}, "synthetic"),
    ({"source": "a_plugin_not_imported"}, "a_plugin_not_imported"),
])
def test_dataset_key_of_an_old_manifest_is_todays_dataset_name(manifest, key):
    assert dataset_key(manifest) == key


def test_a_recorded_dataset_key_and_label_win_and_need_no_registered_source():
    manifest = {"source": "a_plugin_not_imported", "dataset_key": "my-db-v2", "dataset_label": "My DB"}
    assert (dataset_key(manifest), dataset_label(manifest)) == ("my-db-v2", "My DB")
    recorded = {"source": "ptbxl", "source_options": {"task": "rhythm"}, "dataset_key": "ptbxl-rhythm",
                "dataset_label": None}
    assert (dataset_key(recorded), dataset_label(recorded)) == ("ptbxl-rhythm", None)


def test_dataset_labels_and_aliases_are_todays_report_tables():
    labels = dataset_labels()
    assert list(labels.items())[:3] == [("ptbxl", "PTB-XL"), ("icbeb2018", "ICBEB2018"), ("ningbo", "Ningbo")]
    assert {k for name in BUILT_IN for k in source_spec(name).dataset_labels} == {
        "ptbxl", "icbeb2018", "ningbo", "dicom", "muse", "aecg", "edf", "arrays", "auto"}
    assert dataset_label({"source": "muse"}) == "GE MUSE XML"
    assert dataset_aliases()["cpsc2018"] == "icbeb2018"
    assert dataset_label({"source": "cpsc2018"}) == "ICBEB2018"                  # through its alias
    assert dataset_label({"source": "cinc2021", "source_options": {"subsets": ["Ningbo"]}}) == "Ningbo"
    assert dataset_label({"source": "mimic-iv-ecg"}) is None


def test_reader_options_are_todays_for_source():
    data = load_config(overrides=["data.sources.cinc2021.subsets=[Ningbo]", "data.sources.synthetic.seed=4",
                                  "data.synthetic_records=9", "data.sources.code15.label_view=none"]).data
    assert reader_options("cinc2021", data) == {"class_map": "ningbo25", "min_count": 1, "count_column": "Total",
                                                "subsets": ["Ningbo"]}
    assert reader_options("synthetic", data) == {"n_records": 9, "seed": 4}
    assert reader_options("ptbxl", data) == {"label_view": "single", "rate": 500, "min_likelihood": 0.0,
                                             "task": "superdiagnostic", "split": "patients"}
    assert reader_options("code15", data) == {"label_view": "none"}
    assert reader_options("mimic-iv-ecg", data) == {} == reader_options("wfdb", data)
    for name in ("cinc2021", "synthetic", "ptbxl", "cpsc2018"):          # the old entry point delegates
        assert data.sources.for_source(name, 9) == reader_options(name, data)
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        data.sources.for_source("nope", 9)


def test_the_options_classes_moved_beside_their_readers_and_stay_importable():
    from coreecg.config import CinC2021Options, PTBXLOptions
    from coreecg.data.sources.cinc2021 import CinC2021Options as moved

    assert CinC2021Options is moved and PTBXLOptions is source_spec("ptbxl").options
    with pytest.raises(ImportError):
        from coreecg.config import NoSuchOptions  # noqa: F401


# ---------------------------------------------------------------------------- registering


def test_register_source_refuses_what_it_cannot_carry(scratch_registry):
    class Reader:
        class_names, multilabel = (), False

    with pytest.raises(ValueError, match="'Bad.Name': lower-case letters"):
        register_source("Bad.Name")(Reader)
    with pytest.raises(ValueError, match="options must be a dataclass"):
        register_source("reader_x", options=dict)(Reader)
    with pytest.raises(ValueError, match="Named.name is 'other'"):
        register_source("reader_x")(type("Named", (), {"name": "other"}))
    with pytest.raises(ValueError, match="'ptbxl' is already registered by coreecg.data.sources.ptbxl.PTBXLSource"):
        register_source("ptbxl")(Reader)
    with pytest.raises(TypeError, match="decorates a reader class"):
        register_source("reader_x")(lambda: None)
    assert "reader_x" not in scratch_registry.SOURCES and "Bad.Name" not in scratch_registry.SOURCES


def test_a_registered_source_brings_its_section_index_file_and_label(scratch_registry, tmp_path):
    @dataclass
    class Options:
        depth: int = 2

    @register_source("toy_scratch", options=Options, dataset_label="Toy", label_free={"depth": 0},
                     index_file=IndexFile("toy.csv", ("rec",), "its depth would be lost"))
    class Toy:
        class_names, multilabel = (), False

        def __init__(self, depth=2):
            self.depth = depth

    assert Toy.name == "toy_scratch"
    data = load_config(overrides=["data.sources.toy_scratch.depth=5"]).data
    assert get_source("toy_scratch", **reader_options("toy_scratch", data)).depth == 5
    assert list(dataset_labels())[-1] == "toy_scratch" and dataset_labels()["toy_scratch"] == "Toy"
    assert label_free_options()["toy_scratch"] == {"depth": 0}
    with pytest.raises(ConfigError, match=r"data\.sources\.toy_scratch\.depth: expects an integer"):
        load_config(overrides=["data.sources.toy_scratch.depth=deep"])
    # its index file: the generic reader refuses the folder naming it (the header decides)
    (tmp_path / "toy.csv").write_text("other,columns\n")
    (tmp_path / "r.hea").write_text("r 1 500 5000\nr.dat 16 200 16 0 0 0 0 I\n")
    assert layout_source(tmp_path / "toy.csv") is None
    (tmp_path / "toy.csv").write_text("rec,depth\n")
    assert layout_source(tmp_path / "toy.csv") == "toy_scratch"
    with pytest.raises(ValueError, match="marks a toy_scratch folder: read it with --source toy_scratch.*its depth "
                                         "would be lost"):
        get_source("wfdb").list_records(tmp_path)


def test_layouts_are_todays_known_layouts(tmp_path):
    from coreecg.data.sources.wfdb_generic import known_layout

    for name, first_line, source in (("ptbxl_database.csv", "anything\n", "ptbxl"),
                                     ("record_list.csv", "subject_id,study_id,file_name\n", "mimic-iv-ecg"),
                                     ("record_list.csv", "id,file\n", None),
                                     ("REFERENCE.csv", "Recording,First_label,Second_label\n", "cpsc2018"),
                                     ("REFERENCE.csv", "A00001,N\n", None), ("RECORDS", "a\n", None)):
        (tmp_path / name).write_text(first_line)
        assert known_layout(tmp_path / name) == layout_source(tmp_path / name) == source, name
    lost = {n: source_spec(n).index_file.lost for n in ("ptbxl", "mimic-iv-ecg", "cpsc2018")}
    assert lost["mimic-iv-ecg"] == "subject ids (patients) would be lost"
    assert lost["cpsc2018"] == "its labels would be lost" and "records100/ and records500/" in lost["ptbxl"]


# ---------------------------------------------------------------------------- the open data.sources section


def test_data_sources_is_an_open_section_naming_the_known_sources(built_ins_only, tmp_path):
    with pytest.raises(ConfigError, match=r"data\.sources\.ptb_xl: unknown key \(no registered source.*plugins\); "
                                          r"the data\.sources keys are aecg, arrays, auto, cinc2021, code15, cpsc2018, "
                                          r"dicom, edf, muse, ptbxl, synthetic"):
        load_config(overrides=["data.sources.ptb_xl.rate=100"])
    saved = load_config(overrides=["data.sources.ptbxl.rate=100"]).to_dict()
    assert list(saved["data"]["sources"]) == ["ptbxl", "cpsc2018", "cinc2021", "code15", "synthetic",
                                              "dicom", "muse", "aecg", "edf", "arrays", "auto"]
    assert saved["data"]["sources"]["ptbxl"]["rate"] == 100 and saved["plugins"] == []
    with pytest.raises(ConfigError, match=r"^plugins: cannot import 'no_such_plugin_module'"):
        load_config(overrides=["plugins=[no_such_plugin_module]"])
    f = tmp_path / "run.yaml"
    f.write_text("plugins: [no_such_plugin_module]\n")
    with pytest.raises(ConfigError, match=rf"^{f}: plugins: cannot import 'no_such_plugin_module'"):
        load_config(f)


def test_the_config_and_the_generic_reader_name_no_source():
    """Adding a source edits neither: the config reads data.sources.<name> through the registry,
    the generic reader asks it which folders to refuse."""
    import ast
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    hits = [f"{path.name}:{node.lineno}: {node.value}"
            for path in [*(repo / "coreecg" / "config").glob("*.py"),
                         repo / "coreecg" / "data" / "sources" / "wfdb_generic.py"]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in SOURCES
            and node.value not in ("wfdb", "auto")]      # "auto" is also an ordinary value (train.device=auto)
    assert hits == []
