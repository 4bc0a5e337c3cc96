"""Where a sweep's Optuna study lives: an RDB storage (an SQLite file in the sweep folder by default,
any database URL for a sweep that spans machines), so the study can be watched while it runs
(`optuna-dashboard <url>`), read after the sweep's process is gone, and continued by --resume."""
from __future__ import annotations

from pathlib import Path

# Lazy imports: optuna (the `ray` extra): the sweep modules import without it.

STUDY_FILE = "optuna.db"


class StudyError(ValueError):
    """A stored study that a sweep may not start on or continue (the message says why)."""


def study_storage(output: Path, url: str = "") -> tuple[str, str]:
    """(the storage URL, the study's name): `url`, else sqlite:///<output>/optuna.db; the name is
    the sweep folder's (one study per sweep folder). Writes nothing (`open_storage` does)."""
    output = Path(output).expanduser().resolve()
    return url or f"sqlite:///{output / STUDY_FILE}", f"coreecg-{output.name}"


def open_storage(url: str):
    """An Optuna RDB storage at `url` (the schema created on first use; an SQLite file's folder too)."""
    import optuna

    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.RDBStorage(url)


def stored_direction(url: str, name: str) -> str | None:
    """"max" or "min" of the study `name` in `url`, None where it holds none. An SQLite file that
    does not exist is not created."""
    import optuna

    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        return None
    try:
        study = optuna.load_study(study_name=name, storage=url)
    except KeyError:
        return None
    return "max" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "min"


def check_study(url: str, name: str, mode: str, resume: bool) -> None:
    """A new sweep never starts on a stored study (it would mix two searches and silently keep the
    first one's direction); --resume continues only a study of the same direction. StudyError."""
    held = stored_direction(url, name)
    if held is not None and not resume:
        raise StudyError(f"{url} already holds the Optuna study {name!r}: pass --resume to continue that sweep, or "
                         "another --output (or --optuna-storage)")
    if held is not None and held != mode:
        raise StudyError(f"{url}: the stored study {name!r} {'maximises' if held == 'max' else 'minimises'} its "
                         f"objective, but this --metric is {'maximised' if mode == 'max' else 'minimised'}: resume "
                         "with the sweep's own --metric")


def load_stored_study(url: str, name: str):
    """The stored study, read back (None when the storage holds none of that name)."""
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=url)
    except KeyError:
        return None


__all__ = ["STUDY_FILE", "StudyError", "study_storage", "open_storage", "stored_direction", "check_study",
           "load_stored_study"]
