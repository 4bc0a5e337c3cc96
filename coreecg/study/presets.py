"""The study presets: the paper's ablation (jobs/ablate.py) and mask-rate sensitivity study
(jobs/sweep_mask_rates.py) built in code as a study file's data. The jobs only parse their flags,
call these, and end with `coreecg.cli.run_study_job` (run, report, say what finished).

    head, corpora = preset_study(output, config, overrides, finetune)   # what every preset starts with
    data = ablation_study(output, variants=..., names=..., pretrained=..., tables=..., seeds=[0], ...)

Everything heavy (the runner, the report, Ray) is imported when a function runs: a job's --help
imports this module and nothing else of the study.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from coreecg.data.corpus import load_manifest
from coreecg.study.spec import absolute_overrides
from coreecg.tune.spaces import NOT_AVAILABLE, NO_PRETRAINING

# Lazy imports: the source registry (every reader: about 1 s), where a preset names a dataset.


def preset_study(output: Path, config: str | None, overrides: list[str], finetune: list[str]) -> tuple[dict, dict]:
    """What every preset's study file starts with (its name, config and --set, paths made
    absolute) and its downstream corpora (dataset name -> {path}) from --finetune folders."""
    from coreecg.data.sources import dataset_key

    head = {"name": output.name, **({"config": str(Path(config).resolve())} if config else {}),
            "set": absolute_overrides(overrides)}
    corpora = {dataset_key(load_manifest(c)): {"path": str(c)}
               for c in (Path(c).expanduser().resolve() for c in finetune)}
    return head, corpora


# ---------------------------------------------------------------------------- the ablation


def ablation_variants(space: Any, variants_file: str, only: str | None
                      ) -> tuple[list[str], list[str], list[str], dict[str, str]]:
    """A loaded variants file (`coreecg.tune.spaces.load_space`) and --only (a comma list, or None
    for every variant) -> (names, the pretrained ones, the tables that show any of them, the
    unavailable ones with why). ValueError naming `variants_file` for a file without variants or
    an unknown name."""
    if not space.variants:
        raise ValueError(f"{variants_file}: needs a 'variants' section")
    names = [n.strip() for n in only.split(",")] if only else list(space.variants)
    unknown = [n for n in names if n not in space.variants]
    if unknown:
        raise ValueError(f"--only: unknown variant(s) {unknown}; {variants_file} has {list(space.variants)}")
    pretrained = [n for n in names if space.variants[n] not in (*NO_PRETRAINING, NOT_AVAILABLE)]
    tables = [t for t, methods in space.tables.items() if set(methods) & set(names)]
    unavailable = {n: space.unavailable[n] for n in names if space.variants[n] == NOT_AVAILABLE}
    return names, pretrained, tables, unavailable


def ablation_study(output: Path, *, variants: str, config: str | None, overrides: list[str],
                   finetune: list[str], seeds: list[int], names: list[str], pretrained: list[str],
                   tables: list[str]) -> dict:
    """The ablation as a study file's data (absolute paths): every pretrained variant per seed,
    probed each epoch; with `finetune` corpora, every variant fine-tuned there and `tables`."""
    head, corpora = preset_study(output, config, overrides, finetune)
    study: dict = {**head, "variants": str(Path(variants).resolve()),
                   "pretrain": {"methods": pretrained, "seeds": seeds, "set": ["train.eval_every_epochs=1"]}}
    if corpora:
        study["downstream"] = {"corpora": corpora, "methods": names, "modes": ["finetune"], "seeds": seeds}
        study["report"] = {"tables": tables}
    return study


# ---------------------------------------------------------------------------- the mask-rate grid


def mask_rate_study(output: Path, *, variants: str | Path, space: str, variant: str, config: str | None,
                    overrides: list[str], finetune: list[str], seeds: list[int]) -> dict:
    """The mask-rate grid as a study file's data (absolute paths): no other pretraining, no
    downstream grid; the cells of `space` (masking of `variant` in `variants`) and, with
    `finetune` corpora, their fine-tunings."""
    head, corpora = preset_study(output, config, overrides, finetune)
    study: dict = {**head, "variants": str(Path(variants).resolve()),
                   "pretrain": {"methods": []},
                   "mask_rates": {"space": str(Path(space).resolve()), "variant": variant, "seeds": seeds},
                   "report": {"tables": [], "figures": ["mask_rates"]}}
    if corpora:
        study["downstream"] = {"corpora": corpora, "grids": {}}
    return study


def rank_correlation_lines(output: Path) -> list[str]:
    """One line per dataset of the mask-rate figure's rank_correlation.csv (Spearman's rho between
    the cells' probe_auroc and their fine-tuned AUROC); none when it was not written."""
    path = Path(output) / "report" / "figures" / "mask_rates" / "rank_correlation.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [f"  {r['dataset']}: Spearman rho(probe_auroc, fine-tuned AUROC) = {float(r['rho']):.3f} "
                f"[{float(r['low']):.3f}, {float(r['high']):.3f}] over {r['cells']} cells"
                + (f" ({r['note']})" if r["note"] else "") for r in csv.DictReader(f)]
