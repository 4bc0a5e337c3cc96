"""Pretraining on a mixture of corpora (coreecg.train.mixture, docs/mixtures.md): per-corpus draws
at the weights, reproducible under train.seed and on any number of workers, duplicates used once,
preprocessing checked, and everything that reads one corpus saying so for a list.

The corpora are tiny synthetic ones built in this process (no Ray): `a` (40 records, seed 1),
`b` (80 records, seed 2), `c` (60 records, seed 1: a superset of a's recordings) and `lowpass`
(like a, band-passed at 35 Hz), `a_all` (a's recordings, all in train)."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from coreecg.config import ConfigError, load_config
from coreecg.train.mixture import MixtureError, corpus_counts, mixture_files, quotas, resolve_mixture
from tests.helpers import build_synthetic, tiny_config


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mixture-corpora")
    return {"a": build_synthetic(root / "a", 40, 1), "b": build_synthetic(root / "b", 80, 2),
            "c": build_synthetic(root / "c", 60, 1),
            "lowpass": build_synthetic(root / "lowpass", 12, 1, "data.preprocess.lowpass_hz=35"),
            "a_all": build_synthetic(root / "a_all", 40, 1, "data.split_ratios=[1.0, 0.0, 0.0]")}


def _train_rows(corpus: Path) -> int:
    from coreecg.data.reading import split_rows

    return split_rows(corpus, "train")


# ---------------------------------------------------------------------------- config


def test_data_corpus_takes_a_list_and_a_single_path_stays_a_path():
    one = load_config(overrides=["data.corpus=/x/a"])
    assert one.data.corpus == "/x/a" and not one.data.is_mixture and one.data.corpora == ("/x/a",)
    assert load_config(overrides=["data.corpus=[/x/a]"]).data.corpus == "/x/a"       # a one-item list: that path
    mix = load_config(overrides=["data.corpus_weights=[3, 1]", "data.corpus=[/x/a, /x/b]"])   # any order
    assert mix.data.corpus == ("/x/a", "/x/b") and mix.data.corpus_weights == (3.0, 1.0) and mix.data.is_mixture
    assert load_config(overrides=["data.corpus=19182_00000"]).data.corpus == "19182_00000"   # text stays text
    from coreecg.config import config_from_dict

    assert config_from_dict(mix.to_dict()).data.corpus == mix.data.corpus
    with pytest.raises(ConfigError, match="one weight per corpus"):
        load_config(overrides=["data.corpus=[/x/a, /x/b]", "data.corpus_weights=[1]"])
    with pytest.raises(ConfigError, match="synthetic corpus cannot be mixed"):
        load_config(overrides=["data.corpus=[/x/a, '']"])


def test_what_reads_one_corpus_says_so_for_a_mixture(corpora):
    from coreecg.data.locate import MixtureConfigError, training_corpus
    from coreecg.train.finetuning import plan_finetune

    cfg = tiny_config(f"data.corpus=[{corpora['a']}, {corpora['b']}]", "finetune.mode=scratch")
    with pytest.raises(MixtureConfigError, match="a mixture is for pretraining only"):
        training_corpus(cfg)
    with pytest.raises(ValueError, match="lists 2 corpora"):
        plan_finetune(cfg)


# ---------------------------------------------------------------------------- the sampler


def test_quotas_follow_the_weights_and_sum_to_the_epoch():
    assert quotas([34, 65], [3, 1]) == [74, 25]              # 0.75 * 99 = 74.25, 0.25 * 99 = 24.75
    assert quotas([34, 65], [34, 65]) == [34, 65]            # proportional to size: every window once
    assert sum(quotas([7, 11, 13], [1, 1, 1])) == 31
    for q, w in zip(quotas([100, 1], [0.2, 0.8]), [0.2, 0.8]):
        assert abs(q - w * 101) < 1


def test_a_corpus_counts_draw_evenly_without_replacement_within_a_pass():
    up = corpus_counts(0, 1, 0, 10, 25)                      # weighted up: every window 2 or 3 times
    assert up.sum() == 25 and set(up.tolist()) == {2, 3} and (up == 3).sum() == 5
    down = corpus_counts(0, 1, 0, 10, 4)                     # weighted down: 4 distinct windows
    assert down.sum() == 4 and set(down.tolist()) <= {0, 1}
    assert np.array_equal(down, corpus_counts(0, 1, 0, 10, 4))
    assert not all(np.array_equal(down, corpus_counts(0, e, 0, 10, 4)) for e in range(2, 6))  # fresh per epoch
    assert not all(np.array_equal(down, corpus_counts(s, 1, 0, 10, 4)) for s in range(1, 5))  # and per seed


def test_default_weights_are_proportional_to_size(corpora):
    m = resolve_mixture([corpora["a"], corpora["b"]])
    na, nb = _train_rows(corpora["a"]), _train_rows(corpora["b"])
    assert m.sizes == (na, nb) and m.quotas == (na, nb) and not m.weights_given
    assert m.weights == pytest.approx((na / (na + nb), nb / (na + nb)))
    counts = m.draw(3, 0)
    assert np.array_equal(counts, np.ones(na + nb, np.int32))   # every window exactly once per epoch


@pytest.mark.parametrize("world", [2, 3])
def test_the_epoch_draw_does_not_depend_on_the_worker_count(corpora, world):
    """Same (seed, epoch) -> the same rows on 1, 2 or 3 workers; the ranks' shares partition the
    epoch's layout (each rank a contiguous equal part; at most world-1 rows left over)."""
    files = mixture_files(resolve_mixture([corpora["a"], corpora["b"]], [3, 1]))
    for epoch in (0, 1):
        whole = files.rank_uids(7, epoch, 0, 1)
        counts = files.mixture.draw(7, epoch)
        assert collections.Counter(whole.tolist()) == {u: int(c) for u, c in enumerate(counts) if c}
        shares = [files.rank_uids(7, epoch, r, world) for r in range(world)]
        q = len(whole) // world
        assert [len(s) for s in shares] == [q] * world
        assert np.array_equal(np.concatenate(shares), whole[:q * world])
    assert not np.array_equal(np.sort(files.rank_uids(7, 0, 0, 1)), np.sort(files.rank_uids(8, 0, 0, 1)))


def test_streamed_batches_hold_the_drawn_windows(corpora):
    """What the workers stream is the draw: every batch row is the stored window its uid names."""
    import torch

    from coreecg.data.reading import read_split
    from coreecg.train.ingest import epoch_batches

    files = mixture_files(resolve_mixture([corpora["a"], corpora["b"]], [3, 1]))
    stored = np.concatenate([read_split(c, "train", ["signal"])["signal"] for c in (corpora["a"], corpora["b"])])
    sig, uid = zip(*epoch_batches(files, 8, 1, 5, 0, 16, torch.device("cpu"), 1))
    sig, uid = torch.cat(sig), torch.cat(uid)
    assert len(uid) == files.windows - files.windows % 8
    assert np.array_equal(sig.float().numpy(), stored[uid.numpy()].astype(np.float32))
    drawn = files.rank_uids(5, 1, 0, 1)
    assert collections.Counter(uid.tolist()) <= collections.Counter(drawn.tolist())


# ---------------------------------------------------------------------------- duplicates, preprocessing


def test_duplicate_recordings_are_used_once_and_counted(corpora):
    na, nc = _train_rows(corpora["a"]), _train_rows(corpora["c"])
    twice = resolve_mixture([corpora["a"], corpora["a"]])          # the same corpus listed twice
    assert twice.sizes == (na, 0) and twice.quotas == (na, 0)
    assert twice.duplicates[1]["dropped_windows"] == na
    assert twice.duplicates[1]["duplicate_of"] == {str(corpora["a"]): na}
    assert twice.duplicates[1]["dropped_records"] == na             # one window per synthetic record

    m = resolve_mixture([corpora["a"], corpora["c"]])              # c holds a's recordings, and more
    dropped = m.duplicates[1]["dropped_windows"]
    assert 0 < dropped < nc and m.sizes == (na, nc - dropped)
    assert m.duplicates[1]["duplicate_of"] == {str(corpora["a"]): dropped}
    assert m.duplicates[0]["dropped_windows"] == 0
    counts = m.draw(0, 0)
    assert counts[m.offsets[1]:][~m.keep[1]].sum() == 0            # no dropped window is ever drawn
    with pytest.raises(MixtureError, match="no train window left"):
        resolve_mixture([corpora["a"], corpora["a"]], [1, 1])


def test_a_preprocessing_mismatch_names_both_corpora_and_the_key(corpora):
    with pytest.raises(MixtureError) as e:
        resolve_mixture([corpora["a"], corpora["lowpass"]])
    msg = str(e.value)
    assert str(corpora["a"]) in msg and str(corpora["lowpass"]) in msg and "preprocess.lowpass_hz" in msg


def test_the_leakage_guard_reads_every_corpus_of_a_mixture(corpora):
    from coreecg.data.overlap import LeakageError
    from coreecg.train.leakage_guard import Pretraining, _of_paths, check_overlap, fingerprints_of

    pre = _of_paths([str(corpora["a"]), str(corpora["b"])])
    assert pre.mixture == (str(corpora["a"]), str(corpora["b"])) and pre.recorded == list(pre.mixture)
    table, _ = fingerprints_of(pre)
    one = [fingerprints_of(Pretraining(str(c)))[0].num_rows for c in (corpora["a"], corpora["b"])]
    assert table.num_rows == sum(one)
    entry, _ = check_overlap(pre, corpora["a"], allow=True)
    assert entry["pretraining_corpus"] == list(pre.mixture) and entry["checked"] and not entry["overlap"]
    # a's val/test recordings are in a_all's train: a mixture holding a_all leaks into a, b alone does not
    leaky = _of_paths([str(corpora["b"]), str(corpora["a_all"])])
    with pytest.raises(LeakageError, match="a_all"):
        check_overlap(leaky, corpora["a"], allow=False)
    entry, overlap = check_overlap(leaky, corpora["a"], allow=True)
    assert entry["overlap"] and entry["b_records"] > 0 and entry["pretraining_corpus"] == list(leaky.mixture)
    assert not check_overlap(_of_paths([str(corpora["b"])]), corpora["a"], allow=False)[0]["overlap"]


# ---------------------------------------------------------------------------- pretraining end to end


def _pretrain(corpora: dict[str, Path], out: Path, *extra: str) -> tuple[list[dict], dict, object]:
    """Pretrain 2 tiny epochs on a and b in this process (one worker; no Ray cluster: mixtures
    stream) -> (epoch lines of metrics.jsonl, run.json's data, the plan)."""
    from coreecg.train import fit as fitmod
    from coreecg.train.pretraining import plan_pretrain

    cfg = tiny_config(f"data.corpus=[{corpora['a']}, {corpora['b']}]", "optim.batch_size=8", "optim.epochs=2",
                      "optim.warmup_epochs=1", "train.eval_every_epochs=0", "train.figures=false",
                      "train.num_workers=1", f"train.storage_path={out.parent}", f"train.name={out.name}", *extra)
    plan = plan_pretrain(cfg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fitmod, "start_ray", lambda config: None)
        import ray

        mp.setattr(ray, "is_initialized", lambda: True)
        fitmod.fit(plan, report_fn=lambda metrics: None)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    data = json.loads((out / "run.json").read_text())["sessions"][-1]["data"]
    return lines, data, plan


def test_pretraining_draws_each_corpus_at_its_weight(corpora, tmp_path):
    lines, data, plan = _pretrain(corpora, tmp_path / "w31", "data.corpus_weights=[3, 1]")
    na, nb = _train_rows(corpora["a"]), _train_rows(corpora["b"])
    n = na + nb
    epochs = [x for x in lines if x.get("kind") == "epoch"]
    assert len(epochs) == 2
    for e in epochs:
        drawn = [c["drawn"] for c in e["mixture"]]
        trained = [c["trained"] for c in e["mixture"]]
        assert [c["corpus"] for c in e["mixture"]] == ["a", "b"]
        assert drawn == quotas([na, nb], [3, 1]) and abs(drawn[0] - 0.75 * n) <= 0.5
        assert sum(trained) == plan.steps_per_epoch * 8                   # full batches only
        assert all(0 <= d - t <= n - sum(trained) for d, t in zip(drawn, trained))
    start = next(x for x in lines if x.get("event") == "mixture")
    assert [c["windows_per_epoch"] for c in start["corpora"]] == drawn
    assert [c["corpus"] for c in data["corpora"]] == [str(corpora["a"]), str(corpora["b"])]
    assert all(c["fingerprints_sha256"] for c in data["corpora"]) and data["weights"] == "data.corpus_weights"
    assert any("a mixture of 2" in line for line in plan.describe())

    again, _, _ = _pretrain(corpora, tmp_path / "again", "data.corpus_weights=[3, 1]")
    assert [x["mixture"] for x in again if x.get("kind") == "epoch"] == [e["mixture"] for e in epochs]
    assert [x["loss"] for x in again if x.get("kind") == "epoch"] == [e["loss"] for e in epochs]
    other, _, _ = _pretrain(corpora, tmp_path / "seed1", "data.corpus_weights=[3, 1]", "train.seed=1")
    assert [x["loss"] for x in other if x.get("kind") == "epoch"] != [e["loss"] for e in epochs]


def test_pretraining_records_the_duplicates_it_left_out(corpora, tmp_path):
    from coreecg.train.pretraining import plan_pretrain

    cfg = tiny_config(f"data.corpus=[{corpora['a']}, {corpora['c']}]", "optim.batch_size=8",
                      f"train.storage_path={tmp_path}", "train.name=dup")
    plan = plan_pretrain(cfg)
    dropped = plan.mixture.duplicates[1]["dropped_windows"]
    assert dropped > 0 and plan.train_windows == _train_rows(corpora["a"]) + _train_rows(corpora["c"]) - dropped
    assert any(f"{dropped} duplicate window(s) of {corpora['a']}" in line for line in plan.describe())
    from coreecg.train.plan import RunPlan, write_run_folder

    assert RunPlan.from_dict(plan.to_dict()).mixture == plan.mixture
    write_run_folder(plan)
    data = json.loads((tmp_path / "dup" / "run.json").read_text())["sessions"][-1]["data"]
    assert data["corpora"][1]["dropped_windows"] == dropped
    assert data["corpora"][1]["duplicate_of"] == {str(corpora["a"]): dropped}


def test_a_study_resolves_the_paths_of_a_mixture(tmp_path):
    from coreecg.study.spec import study_from_dict
    from tests.helpers import TINY

    repo = Path(__file__).resolve().parents[1]
    data = {"name": "mix", "set": [*TINY, "data.corpus=[a, ../b]"],
            "variants": str(repo / "tune_spaces" / "ablations.yaml"),
            "pretrain": {"methods": ["CoRe-ECG"], "seeds": [0]},
            "downstream": {"corpora": {"d": {"path": str(tmp_path / "d")}}, "methods": ["CoRe-ECG"]},
            "report": {"tables": ["comparison"]}}
    study = study_from_dict(data, tmp_path / "sub" / "study.yaml", ["data.corpus_weights=[1, 2]"])
    cfg = load_config(study.config_file, study.pretrain_overrides(study.pretrain_runs()[0]))
    assert cfg.data.corpus == (str(tmp_path / "sub" / "a"), str(tmp_path / "b"))
    assert cfg.data.corpus_weights == (1.0, 2.0)
