"""What a new user met in sweeps (issue 61): a sweep on a plugin objective or on probe_auroc_full
names its equal-budget best (results.csv carries the objective's final value, from the registries,
not a fixed list); the stored Optuna study marks trials stopped before the budget as PRUNED, so its
best_trial is the equal-budget best; a refused sweep writes nothing, and a folder that holds a
study is refused without --resume. No Ray cluster: the grid is Tune's ResultGrid as far as
result_rows reads it, the searcher is driven as Tune drives it."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest

from coreecg.tune.storage import StudyError, check_study, open_storage, study_storage
from coreecg.tune.sweep import SweepSettings, rank_rows, result_rows

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "plugins=[tests.plugin_objective]"


class _Result:
    """One trial of a Tune ResultGrid, as result_rows reads it."""

    def __init__(self, trial_id: str, epochs: list[dict], p_time: float):
        self.config = {"methods.core.masking.p_time": p_time}
        self.metrics = {**epochs[-1], "trial_id": trial_id, "epoch": len(epochs), "step": 10 * len(epochs)}
        self.metrics_dataframe = pd.DataFrame(epochs)
        self.path, self.error = f"/sweeps/x/tune/{trial_id}", None


def _grid(metric: str) -> list[_Result]:
    """a: stopped by ASHA after epoch 1 with the best early value; b and c ran all 3 epochs."""
    def epoch(value, probe=0.6):
        return {metric: value, "probe_auroc": probe, "probe_auroc_full": probe, "loss": 1.0}

    return [_Result("a", [epoch(0.01 if metric == "top_pc_share" else 0.99)], 0.3),
            _Result("b", [epoch(0.5), epoch(0.4), epoch(0.30)], 0.5),
            _Result("c", [epoch(0.5), epoch(0.3), epoch(0.20)], 0.7)]


@pytest.mark.parametrize("metric, mode, best", [("top_pc_share", "min", "c"), ("probe_auroc_full", "max", "b"),
                                                ("knn_acc", "max", "b"), ("embedding_std", "max", "b")])
def test_a_sweep_on_any_objective_names_its_equal_budget_best(metric, mode, best, tmp_path):
    settings = SweepSettings(output=tmp_path / "sweep", config_file=None, base=[PLUGIN, "optim.epochs=3"],
                             metric=metric)
    assert settings.mode == mode                     # the direction its registration declares
    rows = result_rows(_grid(metric), ["methods.core.masking.p_time"], settings)
    assert all(isinstance(r[metric], float) and not math.isnan(r[metric]) for r in rows)
    compared = rank_rows(rows, metric, mode)
    assert [r["trial_id"] for r in compared][0] == best and {r["trial_id"] for r in compared} == {"b", "c"}
    assert [(r["trial_id"], r["compared_at_epoch"]) for r in rows if r["rank"] is None] == [("a", 3)]
    assert {"knn_auroc", "knn_acc", "rankme", "embedding_std", "top_pc_share", "loss_rec"} <= set(rows[0])


def _drive(search, trial_id: str, values: list[float]) -> None:
    """What Tune does: suggest, one result per epoch, and the last one (ASHA's stop, or the end)
    passed only as the trial's completion."""
    search.suggest(trial_id)
    for epoch, v in enumerate(values[:-1], start=1):
        search.on_trial_result(trial_id, {"m": v, "training_iteration": epoch, "epoch": epoch})
    n = len(values)
    search.on_trial_complete(trial_id, {"m": values[-1], "training_iteration": n, "epoch": n})


def test_the_stored_study_keeps_the_equal_budget_rule(tmp_path):
    from ray.tune.search.optuna import OptunaSearch

    from coreecg.tune.search import EqualBudgetOptunaSearch

    space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}

    def run(cls, name, **extra):
        url = f"sqlite:///{tmp_path / name}.db"
        search = cls(space=space, metric="m", mode="max", seed=0, storage=open_storage(url), study_name=name, **extra)
        _drive(search, "stopped", [0.95])                    # ASHA stopped it after epoch 1
        _drive(search, "full_1", [0.5, 0.6, 0.7])
        _drive(search, "full_2", [0.5, 0.8, 0.85])
        return optuna.load_study(study_name=name, storage=url)

    ray_own = run(OptunaSearch, "ray")
    assert ray_own.best_value == pytest.approx(0.95)         # the defect: a 1-epoch trial is Ray's best
    study = run(EqualBudgetOptunaSearch, "ours", budget=3)
    assert study.best_value == pytest.approx(0.85) and study.best_trial.user_attrs == {"epochs": 3, "budget": 3}
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE,
                      optuna.trial.TrialState.COMPLETE]
    pruned = study.trials[0]
    assert pruned.intermediate_values == {1: 0.95} and pruned.user_attrs == {"epochs": 1, "budget": 3}
    assert study.trials[2].intermediate_values == {1: 0.5, 2: 0.8}


def _sweep(*args: str) -> int:
    sys.path.insert(0, str(REPO / "jobs"))
    try:
        import sweep
    finally:
        sys.path.pop(0)
    return sweep.main(list(args))


def test_a_refused_sweep_writes_nothing_and_a_held_study_is_refused(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert _sweep("--metric", "no_such_score", "--output", str(out)) == 2
    err = capsys.readouterr().err
    assert "--metric no_such_score: not an objective" in err and "named in `plugins`" in err
    assert not out.exists()                                  # no folder, no optuna.db: nothing to reuse later

    # a folder holding a study (from a sweep that was refused later, or any earlier one)
    url, name = study_storage(out)
    optuna.create_study(study_name=name, storage=open_storage(url), direction="minimize")
    assert _sweep("--metric", "knn_auroc", "--output", str(out)) == 2
    assert "holds a sweep; pass --resume" in capsys.readouterr().err
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == [name]   # untouched

    with pytest.raises(StudyError, match="already holds the Optuna study"):
        check_study(url, name, "max", resume=False)
    with pytest.raises(StudyError, match="minimises its objective, but this --metric is maximised"):
        check_study(url, name, "max", resume=True)
    check_study(url, name, "min", resume=True)
    elsewhere = f"sqlite:///{tmp_path / 'none.db'}"
    check_study(elsewhere, name, "max", resume=False)        # no study there: nothing written either
    assert not (tmp_path / "none.db").exists()
