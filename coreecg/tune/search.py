"""The sweep's searcher: Ray Tune's OptunaSearch, with the stored study holding the equal-budget rule.

Ray's OptunaSearch stores every trial that ends without an error as COMPLETE with its last value,
and a trial ASHA stops at an epoch never has that epoch's value reported (Tune passes a stopping
result to the searcher only as the trial's end). So a trial stopped after one epoch with a high
early score was the stored study's `best_trial`, and optuna-dashboard's best, although others ran
the whole budget (issue 61). Here a trial that ends before `budget` epochs is stored as PRUNED,
its last value reported as the intermediate value of the epoch it stopped at (as Optuna's own
pruners leave a pruned trial); every trial carries the user attributes `epochs` (what it ran)
and `budget`. `best_trial` then compares only trials that ran the whole budget, as
`coreecg.tune.sweep.rank_rows` does, and TPE still learns from the pruned ones.

    searcher = EqualBudgetOptunaSearch(space=..., metric=..., mode=..., storage=..., study_name=...,
                                       budget=cfg.optim.epochs)
"""
from __future__ import annotations

from typing import Any

from optuna.trial import TrialState
from ray.tune.search.optuna import OptunaSearch


class EqualBudgetOptunaSearch(OptunaSearch):
    """OptunaSearch whose stored trials say how far they ran (see the module docstring).
    budget: the epochs a trial that is not stopped runs (optim.epochs)."""

    def __init__(self, *args: Any, budget: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._budget = int(budget)
        self._reported: dict[str, set[int]] = {}     # trial id -> the steps reported to Optuna

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        super().on_trial_result(trial_id, result)
        if trial_id not in self._completed_trials and trial_id in self._ot_trials:
            self._reported.setdefault(trial_id, set()).add(int(result.get("training_iteration", 0)))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials or isinstance(self.metric, list):
            return super().on_trial_complete(trial_id, result, error)
        result = result or {}
        epochs = int(result.get("epoch", 0))
        ot_trial.set_user_attr("epochs", epochs)
        ot_trial.set_user_attr("budget", self._budget)
        value = result.get(self.metric)
        if error or value is None or epochs >= self._budget:
            return super().on_trial_complete(trial_id, result, error)
        # stopped before the budget (ASHA, a collapse): pruned at the epoch it reached
        step = int(result.get("training_iteration", epochs))
        if step not in self._reported.get(trial_id, set()):
            ot_trial.report(float(value), step)
        self._ot_study.tell(ot_trial, state=TrialState.PRUNED)
        self._completed_trials.add(trial_id)


__all__ = ["EqualBudgetOptunaSearch"]
