"""Sweeps and ablations on Ray Tune, end to end at tiny scale through the jobs (attached to the
test session's Ray cluster): an Optuna + ASHA sweep, a mask-rate grid with a failing trial, a
driver killed after its first finished trial and resumed, and a two-variant ablation with
fine-tuning and its tables."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coreecg.config import load_config
from coreecg.methods import CoReECG
from tests.helpers import kill_after_first

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env(ray_session, tmp_path_factory):
    """The jobs' environment (attached to the session cluster) and overrides shared by the sweeps."""
    cache = tmp_path_factory.mktemp("sweep-cache")
    # 128 records: a test split of about 13, 2-3 positive patients per class; the tables here test the
    # sweep machinery, so every class is kept (report.min_positive_patients: tests/test_significance.py)
    sets = ["data.synthetic_records=128", "optim.epochs=2", "data.probe_max_windows=64",
            f"data.cache_dir={cache}", "report.min_positive_patients=1"]
    return {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}, \
        sum((["--set", s] for s in sets), [])


def _run(job: str, *args: str, env, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, f"jobs/{job}", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(open(path)))


def _epoch_lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"kind": "epoch"' in x]


def test_optuna_sweep_writes_results_plot_and_a_usable_best_config(env, tmp_path):
    """On a plugin objective, minimised (issue 61: such a sweep named no best): results.csv ranks it
    at equal budget, and the stored study's best_trial is that same trial."""
    environ, sets = env
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  methods.core.masking.p_time: {type: uniform, low: 0.3, high: 0.7}\n"
                     "  methods.core.loss.tau: {type: loguniform, low: 0.1, high: 0.4}\n")
    out = tmp_path / "sweep"
    plugin = ["--set", "plugins=[tests.plugin_objective]", "--metric", "top_pc_share"]
    done = _run("sweep.py", "--space", str(space), "--num-samples", "4", "--output", str(out), *plugin, *sets,
                env=environ)
    url = f"sqlite:///{out.resolve() / 'optuna.db'}"
    assert f"Optuna study 'coreecg-sweep' in {url}: watch it with `optuna-dashboard {url}`" in done.stdout
    rows = _rows(out / "results.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} <= {"completed", "stopped_early"}
    _check_stored_study(url, rows)
    assert all(0.0 <= float(r["top_pc_share"]) <= 1.0 and 0.0 <= float(r["probe_auroc"]) <= 1.0
               and 0.3 <= float(r["methods.core.masking.p_time"]) <= 0.7 for r in rows)
    assert len({r["methods.core.masking.p_time"] for r in rows}) == 4                     # sampled, not repeated
    assert (out / "importance.png").read_bytes()[:4] == b"\x89PNG"
    best = next(r for r in rows if r["rank"] == "1")               # compared at equal budget (rank_rows)
    assert all(int(r["epochs"]) <= int(best["epochs"]) for r in rows)
    assert all(float(best["top_pc_share"]) <= float(r["top_pc_share"]) for r in rows if r["rank"])
    assert f"best top_pc_share {float(best['top_pc_share']):.4f} (trial {best['trial_id']})" in done.stdout
    cfg = load_config(out / "best_config.yaml")                              # what jobs/pretrain.py --config reads
    assert cfg.methods.core.masking.p_time == pytest.approx(float(best["methods.core.masking.p_time"]), rel=1e-4)
    assert cfg.methods.core.loss.tau == pytest.approx(float(best["methods.core.loss.tau"]), rel=1e-4)
    assert cfg.encoders.coreecg.embed_dim == 32
    for r in rows:                                                           # every trial logs to TensorBoard
        assert any((Path(r["run_dir"]) / "tensorboard").iterdir())
        assert all("probe_auroc" in e and "top_pc_share" in e for e in _epoch_lines(Path(r["run_dir"])))

    # a new sweep on the folder is refused (it holds a study); --resume continues the same stored
    # study: nothing is sampled twice, the study reads back whole
    refused = subprocess.run([sys.executable, "jobs/sweep.py", "--space", str(space), "--output", str(out), *plugin,
                              *sets], cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "pass --resume" in refused.stderr
    _run("sweep.py", "--space", str(space), "--num-samples", "4", "--output", str(out), "--resume", *plugin, *sets,
         env=environ)
    _check_stored_study(url, _rows(out / "results.csv"))
    _check_dashboard_serves(url)


def _check_stored_study(url: str, rows: list[dict]) -> None:
    """The study, read back in this process (the sweep's is gone): one trial per row, same parameters;
    a trial that ran the whole budget is COMPLETE, one stopped earlier PRUNED with its epochs, so the
    study's best_trial is results.csv's rank 1."""
    import optuna

    study = optuna.load_study(study_name="coreecg-sweep", storage=url)
    stored = sorted(round(t.params["methods.core.masking.p_time"], 6) for t in study.trials)
    assert stored == sorted(round(float(r["methods.core.masking.p_time"]), 6) for r in rows)
    by_p = {round(float(r["methods.core.masking.p_time"]), 6): r for r in rows}
    for t in study.trials:
        row = by_p[round(t.params["methods.core.masking.p_time"], 6)]
        assert t.user_attrs["epochs"] == int(row["epochs"]) and t.user_attrs["budget"] == 2
        full = int(row["epochs"]) == 2
        assert t.state == (optuna.trial.TrialState.COMPLETE if full else optuna.trial.TrialState.PRUNED)
    best = next(r for r in rows if r["rank"] == "1")
    assert round(study.best_trial.params["methods.core.masking.p_time"], 6) == \
        round(float(best["methods.core.masking.p_time"]), 6)


def _check_dashboard_serves(url: str) -> None:
    """optuna-dashboard on localhost answers its JSON API for the stored study."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["optuna-dashboard", url, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, body = time.monotonic() + 60, None
        while body is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    body = json.loads(r.read())
            except OSError:
                time.sleep(0.5)
        assert body is not None, "optuna-dashboard did not answer"
        (study,) = [x for x in body["study_summaries"] if x["study_name"] == "coreecg-sweep"]
        assert study["directions"] == ["minimize"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_mask_rate_grid_records_a_failing_trial_and_goes_on(env, tmp_path):
    environ, sets = env
    space = tmp_path / "grid.yaml"
    space.write_text("grid:\n  methods.core.masking.p_time: [0.3, 0.6]\n  optim.batch_size: [32, 4096]\n")
    out = tmp_path / "grid"
    corpus = _synthetic(env)              # labelled: every finished cell's encoder is fine-tuned on it
    # A bad cell fails the same way on every retry (train.max_failures, for lost processes and nodes:
    # tests/test_multinode.py): none here, so the test does not wait for them.
    done = subprocess.run([sys.executable, "jobs/sweep_mask_rates.py", "--space", str(space), "--output", str(out),
                           *sets, "--set", "finetune.epochs=1", "--set", "train.max_failures=0", "--finetune",
                           str(corpus)], cwd=REPO, env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]     # 1: some runs failed, recorded
    figures = out / "report" / "figures" / "mask_rates"
    rows = _rows(figures / "probe_results.csv")
    assert len(rows) == 4
    failed = [r for r in rows if r["status"] == "failed"]
    assert [r["optim.batch_size"] for r in failed] == ["4096", "4096"]
    runs = {r["run_dir"]: r for r in _rows(out / "runs.csv")}
    assert all("no full batch of 4096" in runs[r["run_dir"]]["error"] for r in failed)
    ok = [r for r in rows if r["status"] == "done"]
    assert len(ok) == 2 and all(r["epochs"] == "2" and float(r["probe_auroc"]) > 0 for r in ok)
    assert (figures / "heatmap.png").stat().st_size > 5_000
    # --finetune: the finished cells' encoders fine-tuned, the paper's per-dataset F1 and AUROC heatmaps.
    ft = _rows(figures / "finetune_results.csv")
    assert sorted(r["methods.core.masking.p_time"] for r in ft if r["status"] == "done") == ["0.3", "0.6"]
    assert all(0 <= float(r["auroc"]) <= 1 and r["dataset"] == "synthetic" for r in ft if r["status"] == "done")
    for metric in ("f1", "auroc"):
        assert (figures / f"heatmap_synthetic_{metric}.png").stat().st_size > 5_000
    (corr,) = _rows(figures / "rank_correlation.csv")
    assert corr["dataset"] == "synthetic" and corr["cells"] == "2"      # < 3 cells: no rho (nan), said so
    assert corr["rho"] == "nan" and "3 needed" in corr["note"]


def test_a_killed_sweep_resumes_without_rerunning_finished_trials(env, tmp_path):
    environ, sets = env
    space = tmp_path / "grid.yaml"
    space.write_text("grid:\n  methods.core.masking.p_time: [0.3, 0.5, 0.7]\n  methods.core.masking.p_lead: [0.2]\n")
    out = tmp_path / "resume"
    args = [sys.executable, "jobs/sweep_mask_rates.py", "--space", str(space), "--output", str(out),
            "--concurrency", "1", *sets]
    before = kill_after_first(args, environ, REPO, str(out / "runs/pretrain/*/done.json"), 300)

    again = subprocess.run([*args, "--resume"], cwd=REPO, env=environ, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = _rows(out / "report" / "figures" / "mask_rates" / "probe_results.csv")
    assert len(rows) == 3 and all(r["status"] == "done" for r in rows)
    for d, text in before.items():                      # finished trials trained no further step
        assert (d / "metrics.jsonl").read_text() == text
    # A fresh start on the same folder is refused (it would mix two sweeps).
    fresh = subprocess.run(args, cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 2 and "--resume" in fresh.stderr


def test_ablation_variants_pretrain_finetune_and_tabulate(env, tmp_path):
    environ, sets = env
    out = tmp_path / "ablate"
    corpus = _synthetic(env)              # labelled: the variants' encoders are fine-tuned on it
    _run("ablate.py", "--only", "Contrastive only,Reconstructive only", "--finetune", str(corpus),
         "--output", str(out), *sets, "--set", "finetune.epochs=1", env=environ, timeout=900)
    rows = {r["method"]: r for r in _rows(out / "runs.csv") if r["phase"] == "pretrain"}
    assert set(rows) == {"Contrastive only", "Reconstructive only"}
    con, rec = Path(rows["Contrastive only"]["run_dir"]), Path(rows["Reconstructive only"]["run_dir"])
    assert all("loss_rec" not in e and "loss_con" in e for e in _epoch_lines(con))
    assert all("loss_con" not in e and "loss_rec" in e for e in _epoch_lines(rec))
    con_model, rec_model = (CoReECG(load_config(d / "config.yaml")) for d in (con, rec))
    assert con_model.time_decoder is None and con_model.teacher_encoder is not None
    assert rec_model.teacher_encoder is None and rec_model.fda is None and rec_model.time_decoder is not None
    assert load_config(con / "config.yaml").train.variant == "Contrastive only"
    table = (out / "report" / "tables" / "ablation_paradigm.md").read_text()
    lines = [x for x in table.splitlines() if x.startswith("| ")]
    assert [x.split(" | ")[0][2:] for x in lines[2:4]] == ["Contrastive only", "Reconstructive only"]
    assert not (out / "report" / "tables" / "ablation_stdm_fda.md").exists()     # none of its variants ran
    csv_rows = {r["method"]: r for r in csv.DictReader(open(out / "report" / "tables" / "ablation_paradigm.csv"))}
    counts = {m: [v for k, v in row.items() if k.endswith(" n")] for m, row in csv_rows.items()}
    assert set(counts) == {"Contrastive only", "Reconstructive only"}
    assert counts["Contrastive only"] == counts["Reconstructive only"] == ["1", "1", "1"]
    runs = sorted(p.name for p in (out / "runs" / "finetune").iterdir())
    assert len(runs) == 2 and all(yaml.safe_load((out / "runs" / "finetune" / r / "config.yaml").read_text())
                                  ["finetune"]["method"] in rows for r in runs)


def _synthetic(env) -> Path:
    """The labelled synthetic corpus of the sweeps' settings (built on first use)."""
    _, sets = env
    cache = Path(next(s for s in sets if s.startswith("data.cache_dir=")).split("=", 1)[1])
    found = sorted(cache.glob("synthetic-n128-*"))
    if found:
        return found[0]
    from coreecg.data.locate import synthetic_corpus

    return synthetic_corpus(load_config(overrides=[s for s in sets if s != "--set"]))


def test_multi_worker_trials_run_train_inside_tune(env, tmp_path):
    environ, sets = env
    space = tmp_path / "grid.yaml"
    space.write_text("grid:\n  methods.core.masking.p_time: [0.5]\n  methods.core.masking.p_lead: [0.2]\n")
    out = tmp_path / "ddp"
    _run("sweep_mask_rates.py", "--space", str(space), "--output", str(out), "--set", "train.num_workers=2",
         *sets, env=environ)
    (row,) = _rows(out / "report" / "figures" / "mask_rates" / "probe_results.csv")
    run = Path(row["run_dir"])
    assert row["status"] == "done" and float(row["probe_auroc"]) > 0
    assert load_config(run / "config.yaml").train.num_workers == 2
    assert list(run.glob("checkpoint_step*/checkpoint.pt"))          # Ray Train's checkpoints, in the trial's folder


def test_contrastive_baselines_run_as_trials_finetune_and_fill_the_comparison_table(env, tmp_path):
    environ, sets = env
    out = tmp_path / "baselines"
    corpus = _synthetic(env)
    done = _run("ablate.py", "--only", "MoCo V3,CMSC,BMIRC", "--finetune", str(corpus), "--output", str(out), *sets,
                "--set", "finetune.epochs=1", env=environ, timeout=900)
    assert "BMIRC: not available (not implemented" in done.stderr
    rows = {r["method"]: r for r in _rows(out / "runs.csv") if r["phase"] == "pretrain"}
    assert set(rows) == {"MoCo V3", "CMSC"} and {r["status"] for r in rows.values()} == {"done"}
    for name, method, key in (("MoCo V3", "moco_v3", "query_key_cos"), ("CMSC", "cmsc", "segment_cos")):
        run = Path(rows[name]["run_dir"])
        cfg = load_config(run / "config.yaml")
        assert (cfg.pretrain.method, cfg.train.variant, cfg.method_label) == (method, name, name)
        epochs = _epoch_lines(run)
        assert len(epochs) == 2 and all(key in e and "loss_con" in e and "loss_rec" not in e for e in epochs)
        assert all(0.0 <= e["probe_auroc"] <= 1.0 for e in epochs) and (run / "encoder.pt").is_file()
    finetuned = {json.loads(p.read_text())["method"]: json.loads(p.read_text())
                 for p in (out / "runs" / "finetune").glob("*/metrics.json")}
    assert set(finetuned) == {"MoCo V3", "CMSC"}
    assert all(0.0 <= m["test"]["auroc"] <= 1.0 for m in finetuned.values())
    table = (out / "report" / "tables" / "comparison.md").read_text()
    body = [x.split(" | ")[0][2:] for x in table.splitlines() if x.startswith("| ")]
    assert body[2:5] == ["MoCo V3", "CMSC", "BMIRC†"]             # Table 1's order, BMIRC marked
    assert "† n/a: BMIRC: not implemented" in table
    csv_rows = {r["method"]: r for r in csv.DictReader(open(out / "report" / "tables" / "comparison.csv"))}
    assert [v for k, v in csv_rows["CMSC"].items() if k.endswith(" n")] == ["1", "1", "1"]
    assert csv_rows["BMIRC"]["note"].startswith("not implemented")


def test_a_methods_key_swept_without_its_method_is_refused(env, tmp_path):
    environ, sets = env
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  methods.moco_v3.temperature: {type: loguniform, low: 0.05, high: 0.5}\n")
    done = subprocess.run([sys.executable, "jobs/sweep.py", "--space", str(space), "--output", str(tmp_path / "s"),
                           *sets], cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "has no effect" in done.stderr and "pretrain.method=moco_v3" in done.stderr
    assert not (tmp_path / "s" / "tune").exists()
