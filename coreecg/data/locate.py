"""Which corpus a run reads: `data.corpus`, else the embedded synthetic corpus (built on first
use under `data.cache_dir`); and the probe's corpus. No Ray here: planning a run resolves its
corpora before any cluster starts (building the synthetic corpus starts one, through the
preprocessing pipeline, only when it is missing)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from coreecg.config import Config

# Lazy imports: the corpus builder (scipy and every reader: 1,300 modules more), where the embedded
# synthetic corpus is built: finding a corpus does not need it.

log = logging.getLogger(__name__)


def synthetic_corpus(config: Config) -> Path:
    """The embedded synthetic corpus as Parquet under `data.cache_dir`, built on first use
    (a re-run skips finished shards, so this is cheap once built)."""
    from coreecg.data.pipeline import build_corpus
    from coreecg.data.sources import reader_options

    d = config.data
    path = (Path(d.cache_dir) / f"synthetic-n{d.synthetic_records}-seed{d.sources.synthetic.seed}").resolve()
    options = reader_options("synthetic", d)
    manifest = path / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        wanted = json.loads(json.dumps([options, d.preprocess.settings(), d.split_ratios, d.shard_records]))
        if [m.get("source_options"), m.get("preprocess"), m.get("split_ratios"), m.get("shard_records")] == wanted:
            return path
    log.info("building the embedded synthetic corpus (%d records) at %s", d.synthetic_records, path)
    build_corpus("synthetic", None, path, d, source_options=options)
    return path


def training_corpus(config: Config) -> Path:
    """data.corpus (resolved), else the embedded synthetic corpus. A mixture (data.corpus a list)
    is an error here: only pretraining reads one (`training_corpora`)."""
    if config.data.is_mixture:
        raise MixtureConfigError(
            f"data.corpus lists {len(config.data.corpora)} corpora ({', '.join(config.data.corpora)}): a mixture is "
            "for pretraining only; this reads one corpus (give data.corpus a single path)")
    return Path(config.data.corpus).resolve() if config.data.corpus else synthetic_corpus(config)


def training_corpora(config: Config) -> list[Path]:
    """Every corpus of data.corpus (resolved): one, a mixture's, or the embedded synthetic one."""
    if config.data.is_mixture:
        return [Path(c).expanduser().resolve() for c in config.data.corpora]
    return [training_corpus(config)]


class MixtureConfigError(ValueError):
    """A list in data.corpus where one corpus is read (fine-tuning, sweeps' fixed corpus)."""


def probe_corpus(config: Config, corpus: Path | list[Path]) -> Path | None:
    """data.probe_corpus, else the training corpus when it is labelled (of a mixture: its first
    labelled corpus), else None."""
    from coreecg.data.corpus import load_manifest

    if config.data.probe_corpus:
        path = Path(config.data.probe_corpus).resolve()
        if not load_manifest(path)["class_names"]:
            raise ValueError(f"data.probe_corpus={path} has no labels")
        return path
    for c in (corpus if isinstance(corpus, list) else [corpus]):
        if load_manifest(c)["class_names"]:
            return c
    return None
