"""Typed config: paper defaults, YAML, overrides, strictness, round trip."""
import pytest

from coreecg.config import Config, ConfigError, ReportConfig, config_from_dict, load_config
from coreecg.config.loading import apply_overrides


def test_defaults_are_the_papers_values():
    c = load_config()
    m, v = c.model, c.encoders.coreecg
    assert (m.arch, v.patch_size, m.input_samples, m.n_leads, c.n_patches) == ("coreecg", 75, 2250, 12, 30)
    assert (v.depth, v.embed_dim, v.num_heads, v.mlp_ratio, v.dropout) == (10, 256, 4, 4.0, 0.0)
    o = c.methods.core
    assert (o.latent_decoder.depth, o.latent_decoder.dim, o.latent_decoder.heads) == (8, 256, 4)
    assert (o.time_decoder.depth, o.time_decoder.dim, o.time_decoder.heads) == (10, 256, 4)
    assert (o.ema.momentum, o.ema.momentum_end, o.fda.enabled, o.fda.learnable) == (0.996, 1.0, True, True)
    k = o.masking
    assert (k.strategy, k.p_time, k.p_lead, k.k) == ("stdm", 0.5, 0.2, 4)
    assert (c.methods.core.loss.tau, c.methods.core.loss.alpha, c.methods.core.loss.beta) == (0.2, 1.0, 1.0)
    o = c.optim
    assert (o.lr, o.weight_decay, o.warmup_epochs, o.epochs, o.batch_size) == (1.5e-4, 0.01, 5.0, 80, 256)
    assert (c.finetune.lr, c.finetune.warmup_epochs, c.finetune.epochs) == (8e-5, 0.0, 80)
    p = c.data.preprocess
    assert (p.sampling_rate, p.window_samples, p.highpass_hz, p.lowpass_hz) == (250, 2500, 0.65, 40.0)


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("masking:\n  p_time: 0.6\n  mode: exact\noptim:\n  lr: 3.0e-4\n")
    c = load_config(f, overrides=["methods.core.masking.p_time=0.7", "optim.lr=1e-3", "methods.core.fda.enabled=false",
                                  "optim.betas=[0.9, 0.99]"])
    assert c.methods.core.masking.p_time == 0.7 and c.methods.core.masking.mode == "exact"
    assert c.optim.lr == 1e-3 and isinstance(c.optim.lr, float)
    assert c.methods.core.fda.enabled is False and c.optim.betas == (0.9, 0.99)


@pytest.mark.parametrize("override, needle", [
    ("masking.p_tim=0.3", "masking.p_tim"),
    ("modle.depth=3", "modle"),
    ("encoders.coreecg.depth=3.5", "encoders.coreecg.depth"),
    ("model.depth=3.5", "encoders.coreecg.depth: expects an integer"),      # a moved key: named at its place now
    ("methods.core.masking.strategy=checkerboard", "methods.core.masking.strategy"),
    ("methods.core.fda.enabled=maybe", "methods.core.fda.enabled"),
    ("methods.core.masking.p_time=1.5", "methods.core.masking: p_time=1.5 must lie in"),
    ("methods.core.masking.k=12", "methods.core.masking.k"),
    ("model", "a.b=value"),
])
def test_bad_keys_and_values_are_named(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(overrides=[override])


def test_unknown_yaml_key_names_the_file_key(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("loss:\n  temperature: 0.1\n")
    with pytest.raises(ConfigError, match=r"loss\.temperature"):
        load_config(f)


def test_round_trip_through_yaml(tmp_path):
    c = load_config(overrides=["methods.core.masking.p_lead=0.3", "train.precision=bf16",
                               "data.preprocess.leads=[I, II]"])
    c.to_yaml(tmp_path / "c.yaml")
    back = load_config(tmp_path / "c.yaml")
    assert back == c and isinstance(back, Config)
    assert config_from_dict(c.to_dict()) == c


def test_reader_options_are_typed_and_reach_get_source():
    from coreecg.data.sources import get_source

    c = load_config(overrides=["data.sources.ptbxl.label_view=multi", "data.sources.ptbxl.rate=100",
                               "data.sources.cinc2021.subsets=[Ningbo]", "data.sources.synthetic_seed=3"])
    s = c.data.sources
    ptbxl = get_source("ptbxl", **s.for_source("ptbxl", 10))
    assert (ptbxl.label_view, ptbxl.rate) == ("multi", 100)
    assert s.for_source("cinc2021", 10)["subsets"] == ["Ningbo"]
    assert load_config().data.sources.for_source("cinc2021", 10)["subsets"] is None   # all databases
    syn = get_source("synthetic", **s.for_source("synthetic", 10))
    assert (syn.n_records, syn.seed) == (10, 3)
    assert s.for_source("mimic-iv-ecg", 10) == {}
    assert get_source("cpsc2018", **s.for_source("cpsc2018", 10)).label_view == "first"   # the paper's task
    cpsc = load_config(overrides=["data.sources.cpsc2018.label_view=multi"]).data.sources
    assert get_source("cpsc2018", **cpsc.for_source("cpsc2018", 10)).multilabel
    with pytest.raises(ConfigError, match=r"data\.sources\.cpsc2018\.label_view"):
        load_config(overrides=["data.sources.cpsc2018.label_view=primary"])
    with pytest.raises(ConfigError, match=r"data\.sources\.ptbxl\.rate"):
        load_config(overrides=["data.sources.ptbxl.rate=250"])


def test_string_fields_keep_their_text_in_overrides():
    # YAML would read these as numbers (underscores are digit separators): a trial id, a folder name.
    cfg = load_config(overrides=["train.name=19182_00000", "data.corpus=/data/1_0", "train.variant=1e3"])
    assert (cfg.train.name, cfg.data.corpus, cfg.train.variant) == ("19182_00000", "/data/1_0", "1e3")
    assert load_config(overrides=["train.seed=1_0"]).train.seed == 10      # numbers still parse as YAML


def test_report_section():
    assert load_config().report == ReportConfig()
    r = ReportConfig()
    assert (r.f1, r.reference, r.bootstrap_resamples, r.level, r.seed) == ("threshold", "CoRe-ECG", 1000, 0.95, 0)
    assert (r.min_runs, r.min_test_patients, r.adjust) == (3, 30, "holm")
    c = load_config(overrides=["report.f1=argmax", "report.reference=ST-MEM", "report.level=0.9",
                               "report.bootstrap_resamples=0", "report.seed=3", "report.min_runs=5",
                               "report.min_test_patients=100", "report.adjust=bh"])
    r = c.report
    assert (r.f1, r.reference, r.level, r.bootstrap_resamples, r.seed) == ("argmax", "ST-MEM", 0.9, 0, 3)
    assert (r.min_runs, r.min_test_patients, r.adjust) == (5, 100, "bh")
    assert config_from_dict(c.to_dict()) == c
    for override, needle in [("report.f1=macro", r"report\.f1"), ("report.level=1", r"report\.level"),
                             ("report.bootstrap_resamples=-1", r"report\.bootstrap_resamples"),
                             ("report.bootstrap_resamples=1", r"report\.bootstrap_resamples=1 must be 0"),
                             ("report.min_runs=1", r"report\.min_runs=1 must be >= 2"),
                             ("report.min_test_patients=-1", r"report\.min_test_patients"),
                             ("report.adjust=bonferroni", r"report\.adjust: 'bonferroni'"),
                             ("report.reference=", r"report\.reference"), ("report.seeds=1", r"report\.seeds")]:
        with pytest.raises(ConfigError, match=needle):
            load_config(overrides=[override])


def test_a_storage_uri_is_refused_with_what_to_use_instead():
    """The run folder is written with POSIX file operations (appends, renames): a bucket URI would
    have become a local folder named "s3:"; it is refused, naming shared mounts."""
    from coreecg.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="s3://bucket/runs: a URI.*every node mounts"):
        load_config(overrides=["train.storage_path=s3://bucket/runs"])


def test_the_moved_synthetic_seed_key_still_loads_at_its_new_place(tmp_path):
    """data.sources.synthetic_seed moved to data.sources.synthetic.seed (issue 42): a file, a saved
    config (a run folder's, as 7162f21 wrote it: no plugins key) and an override that use the old
    key load it there, never ignore it; a file giving both keys differently is refused."""
    f = tmp_path / "old.yaml"
    f.write_text("data:\n  synthetic_records: 16\n  sources:\n    ptbxl: {rate: 100}\n    synthetic_seed: 7\n")
    assert load_config(f).data.sources.synthetic.seed == 7
    saved = Config().to_dict()
    del saved["plugins"], saved["data"]["sources"]["synthetic"]
    saved["data"]["sources"]["synthetic_seed"] = 5
    back = config_from_dict(saved)
    assert back.data.sources.synthetic.seed == 5 and back.data.sources.synthetic_seed == 5
    assert "synthetic_seed" not in back.to_dict()["data"]["sources"] and "synthetic_seed" in saved["data"]["sources"]
    assert load_config(overrides=["data.sources.synthetic_seed=3"]).data.sources.synthetic.seed == 3
    f.write_text("data:\n  sources:\n    synthetic_seed: 7\n    synthetic: {seed: 8}\n")
    with pytest.raises(ConfigError, match=rf"^{f}: data\.sources\.synthetic_seed \(moved to data\.sources\.synthetic"
                                          r"\.seed\) and data\.sources\.synthetic\.seed are both given"):
        load_config(f)


def test_the_vits_sizes_moved_from_model_to_its_encoder_section(tmp_path):
    """model.<size> (before the encoder registry) is read at encoders.<arch>.<size>: from a file, an
    override and a saved config; a published ViT family's saved config (model.arch=st_mem) moves
    them to its own section; both places given differently is an error naming both."""
    f = tmp_path / "old.yaml"
    f.write_text("model:\n  embed_dim: 64\n  depth: 3\n  num_heads: 4\n")
    c = load_config(f, overrides=["model.patch_size=50"])
    assert (c.encoders.coreecg.embed_dim, c.encoders.coreecg.depth, c.patch_size, c.n_patches) == (64, 3, 50, 45)
    assert set(c.to_dict()["model"]) == {"arch", "n_leads", "input_samples"}
    saved = config_from_dict({"model": {"arch": "st_mem", "embed_dim": 192, "depth": 3, "num_heads": 3,
                                        "patch_size": 75, "input_samples": 2250}})
    assert saved.encoder == saved.encoders.st_mem and (saved.encoder.embed_dim, saved.encoder.depth) == (192, 3)
    assert saved.encoders.coreecg.embed_dim == 256          # the paper ViT's section keeps its defaults
    with pytest.raises(ConfigError, match=r"model\.depth \(moved to encoders\.coreecg\.depth\) and "
                                          r"encoders\.coreecg\.depth are both given"):
        config_from_dict({"model": {"depth": 3}, "encoders": {"coreecg": {"depth": 4}}})
    with pytest.raises(ConfigError, match=r"encoders\.coreecg: embed_dim=30 is not divisible.*num_heads=4"):
        load_config(overrides=["encoders.coreecg.embed_dim=30"])
    # keys that go together are checked on the whole config, not after each override
    both = load_config(overrides=["encoders.coreecg.embed_dim=30", "encoders.coreecg.num_heads=3"])
    assert (both.encoder.embed_dim, both.encoder.num_heads) == (30, 3)
    # an override of an old size key lands in the section of the arch the overrides before it chose
    st = apply_overrides(Config(), ["model.arch=st_mem", "model.depth=6"])
    assert (st.encoders.st_mem.depth, st.encoders.coreecg.depth) == (6, 10)
