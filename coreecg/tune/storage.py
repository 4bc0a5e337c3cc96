"""Where a sweep's Optuna study lives: an RDB storage (an SQLite file in the sweep folder by default,
any database URL for a sweep that spans machines), so the study can be watched while it runs
(`optuna-dashboard <url>`), read after the sweep's process is gone, and continued by --resume."""
from __future__ import annotations

from pathlib import Path

# Lazy imports: optuna (the `ray` extra): the sweep modules import without it.

STUDY_FILE = "optuna.db"


def study_storage(output: Path, url: str = "") -> tuple[str, str]:
    """(the storage URL, the study's name): `url`, else sqlite:///<output>/optuna.db; the name is
    the sweep folder's (one study per sweep folder)."""
    output = Path(output).expanduser().resolve()
    if not url:
        output.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{output / STUDY_FILE}"
    return url, f"coreecg-{output.name}"


def open_storage(url: str):
    """An Optuna RDB storage at `url` (the schema created on first use)."""
    import optuna

    return optuna.storages.RDBStorage(url)


def load_stored_study(url: str, name: str):
    """The stored study, read back (None when the storage holds none of that name)."""
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=url)
    except KeyError:
        return None


__all__ = ["STUDY_FILE", "study_storage", "open_storage", "load_stored_study"]
