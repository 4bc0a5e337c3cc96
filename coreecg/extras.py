"""What the light install (`pip install coreecg`) leaves out, and the message that names the extra.

The light install loads exports and runs inference on raw files (coreecg.loading, coreecg.hub,
coreecg.inference). Training, sweeps, studies, evaluation tables and figures need the `ray`
extra (Ray, Optuna, tensorboardX, matplotlib, scikit-learn: pyproject.toml); a job started
without it stops with `pip install 'coreecg[ray]'` instead of a bare ModuleNotFoundError.
"""
from __future__ import annotations

import importlib.util

RAY_EXTRA = "pip install 'coreecg[ray]'"
# The extra's packages by import name (pyproject.toml's `ray` list): training checks them all
# (coreecg.train.plan.preflight), so a half-installed environment gets the install command before
# a worker meets a bare ModuleNotFoundError; predict --workers needs only ray.
RAY_EXTRA_MODULES = ("ray", "optuna", "tensorboardX", "matplotlib", "sklearn")


class MissingExtra(ImportError):
    """A package of an extra is not installed; the message names the extra's install command."""


TRAINING = "training (pretraining, fine-tuning, their sweeps and studies)"     # what needs the whole extra


def require_ray_extra(what: str, modules: tuple[str, ...] = ("ray",)) -> None:
    """MissingExtra naming `what` (a job, a feature) and the install command when one of
    `modules` (import names) is not installed; nothing is imported."""
    missing = [m for m in modules if not _installed(m)]
    if missing:
        raise MissingExtra(f"{what} needs {', '.join(missing)}, which the light install of coreecg leaves out; "
                           f"install the extra: {RAY_EXTRA}")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):     # a finder that refuses it; a module set to None in sys.modules
        return False
