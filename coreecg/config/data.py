"""The data sections: preprocessing (how raw recordings become stored windows), the open
`data.sources` section (each registered source's options) and `data` (what training reads)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from coreecg.typed import OpenSection
from coreecg.config.base import STANDARD_LEADS, ConfigError

# Lazy imports: the source registry, on the first lookup: importing it imports every built-in reader
# (wfdb, pandas: about 1 s and 600 modules; python -X importtime), which a config read
# that names no source does not need.


@dataclass
class PreprocessConfig:
    """How raw recordings become stored windows (paper: Datasets and Preprocessing)."""

    sampling_rate: int = 250          # Hz after resampling
    window_s: float = 10.0            # stored window length; 2,500 samples at 250 Hz
    # shorter records are quarantined; a record between this and window_s is kept as one window
    # padded at its end with NaN (the padding marker, docs/data_pipeline.md "Short records")
    min_duration_s: float = 5.0
    highpass_hz: float = 0.65
    lowpass_hz: float = 40.0
    filter_order: int = 4             # per Butterworth stage; sosfiltfilt doubles the effective order
    leads: tuple[str, ...] = STANDARD_LEADS
    zscore_eps: float = 1e-6          # flat leads z-score to zeros instead of dividing by ~0
    # z-score each window per lead over time (lead: the paper's) or over leads and time together
    # (record: ST-MEM's input contract, docs/published_encoders.md)
    standardize: Literal["lead", "record"] = "lead"
    # Known non-standard leads that are dropped (and noted in the record's meta), e.g. the
    # Frank leads vx, vy, vz of PTB Diagnostic; any other unknown lead quarantines the record.
    extra_leads: tuple[str, ...] = ("VX", "VY", "VZ")
    # Resampling uses exact rational factors up/down; a rate whose ratio to sampling_rate
    # needs a denominator above this (e.g. 257.3 Hz -> 2500/2573) is quarantined.
    resample_max_denominator: int = 1000
    # A published family's name (model.arch): the corpus is built with that family's declared input
    # contract (coreecg.data.contract, the original pipeline's steps) instead of the filter, resampling
    # and z-score above; sampling_rate, window_s and leads are then the contract's stored form
    # (coreecg.model.published.contract_preprocess writes them). docs/published_encoders.md.
    contract: str = ""

    def __post_init__(self) -> None:
        # messages without the section's key: the config's loader prefixes data.preprocess
        if not 0 < self.highpass_hz < self.lowpass_hz < self.sampling_rate / 2:
            raise ConfigError(f"need 0 < highpass_hz ({self.highpass_hz}) < lowpass_hz "
                              f"({self.lowpass_hz}) < sampling_rate/2 ({self.sampling_rate / 2})")
        if not self.min_duration_s > 0:
            raise ConfigError(f"min_duration_s={self.min_duration_s} must be > 0")
        if not self.leads or len(set(self.leads)) != len(self.leads) or not set(self.leads) <= set(STANDARD_LEADS):
            raise ConfigError(f"leads={self.leads} must be distinct names from {STANDARD_LEADS}")

    @property
    def window_samples(self) -> int:
        return int(round(self.window_s * self.sampling_rate))

    def settings(self) -> dict[str, Any]:
        """The settings a corpus records (manifest "preprocess", shard keys): every field, but
        standardize only when not the default, so corpora built before it existed still match."""
        out = dataclasses.asdict(self)
        if out["standardize"] == "lead":
            del out["standardize"]
        if not out["contract"]:
            del out["contract"]
        return out


class SourceOptions(OpenSection):
    """The `data.sources` section: one typed options section per registered source that has one
    (`data.sources.<name>.<key>`), declared beside its reader with
    `coreecg.data.sources.register_source(options=...)`. A section not set holds its defaults."""

    unknown_reason = "no registered source with options of that name; a plugin's module goes in plugins"

    @classmethod
    def section_type(cls, name: str) -> type | None:
        spec = _source_specs().get(name)
        return spec.options if spec is not None else None

    @classmethod
    def known(cls) -> list[str]:
        return sorted(n for n, s in _source_specs().items() if s.options is not None)

    def names(self) -> list[str]:
        """The sections a saved config holds: the built-in sources' and those set explicitly, never
        one only because a plugin was imported in this process (it must reload without it)."""
        specs = _source_specs()
        built_in = [n for n, s in specs.items() if s.cls.__module__.startswith("coreecg.data.sources.")]
        return [n for n in dict.fromkeys([*built_in, *self._sections]) if n in specs and specs[n].options is not None]

    @property
    def synthetic_seed(self) -> int:
        """Moved to data.sources.synthetic.seed (kept for code that reads it)."""
        return self.synthetic.seed

    def for_source(self, name: str, synthetic_records: int = 512) -> dict[str, Any]:
        """Constructor options of `coreecg.data.sources.get_source(name, ...)`; ValueError for an
        unknown source (`coreecg.data.sources.reader_options` with the data section at hand)."""
        from coreecg.data.sources.registry import reader_options

        return reader_options(name, DataConfig(synthetic_records=synthetic_records, sources=self))


def _source_specs() -> dict[str, Any]:
    # The registry sits in the config's layer; importing it registers the built-in readers.
    from coreecg.data.sources.registry import source_specs

    return source_specs()


@dataclass
class DataConfig:
    """What training reads. An empty `corpus` means the embedded synthetic corpus; a list of
    corpora is a pretraining mixture (docs/mixtures.md), drawn in `corpus_weights` proportions
    (empty: proportional to each corpus's train windows). A one-item list is that one path."""

    corpus: str | tuple[str, ...] = ""
    corpus_weights: tuple[float, ...] = ()
    crop_samples: int = 2250          # random crop of the stored 2,500 at training time
    synthetic_records: int = 512      # size of the embedded synthetic corpus
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    sources: SourceOptions = field(default_factory=SourceOptions)
    split_ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)  # train/val/test, by patient
    shard_records: int = 128          # records per corpus shard (the unit of resumption)
    # Where the embedded synthetic corpus is written as Parquet on first use (then reused).
    cache_dir: str = "corpora"
    # Training ingest (Ray Data): rows mixed across shards in each worker's shuffle buffer,
    # and the size below which the train split is held in the object store (no re-reads).
    shuffle_buffer: int = 2048
    cache_in_memory_gb: float = 2.0
    # Labelled corpus for the in-loop representation probe; empty = the training corpus when
    # it has labels (the synthetic corpus does), else no probe.
    probe_corpus: str = ""
    probe_max_windows: int = 1000     # per probe split (train, val): bounds the probe's cost
    # The probe fits on few labels: the mean over `probe_subsets` disjoint subsets of
    # `probe_labels_per_class` train windows per class (0: the whole probe train split). With
    # every label, random encoder features already saturate (docs/decisions.md).
    probe_labels_per_class: int = 10
    probe_subsets: int = 5
    # Embed the probe corpus at every encoder block too (the layer_probe_auroc objective: the best
    # layer's probe); off, as each evaluation then costs a probe per layer. A sweep with
    # --metric layer_probe_auroc turns it on.
    probe_layers: bool = False

    @property
    def corpora(self) -> tuple[str, ...]:
        """data.corpus as a tuple: () for the embedded synthetic corpus, one path, or a mixture's."""
        return self.corpus if isinstance(self.corpus, tuple) else ((self.corpus,) if self.corpus else ())

    @property
    def is_mixture(self) -> bool:
        return isinstance(self.corpus, tuple)

    def __post_init__(self) -> None:
        if isinstance(self.corpus, (tuple, list)):
            corpora = tuple(str(c) for c in self.corpus)
            if any(not c.strip() for c in corpora):
                raise ConfigError(f"data.corpus={list(corpora)}: an empty path in a mixture (the embedded "
                                  "synthetic corpus cannot be mixed)")
            self.corpus = corpora[0] if len(corpora) == 1 else corpora
        if self.corpus_weights and (min(self.corpus_weights) < 0 or sum(self.corpus_weights) <= 0):
            raise ConfigError(f"data.corpus_weights={list(self.corpus_weights)}: weights must be >= 0, not all 0")
        if min(self.split_ratios) < 0 or abs(sum(self.split_ratios) - 1.0) > 1e-6:
            raise ConfigError(f"data.split_ratios={self.split_ratios} must be >= 0 and sum to 1")
        if self.shard_records < 1:
            raise ConfigError(f"data.shard_records={self.shard_records} must be >= 1")
        if self.shuffle_buffer < 0 or self.probe_max_windows < 2 or self.cache_in_memory_gb < 0 \
                or self.probe_labels_per_class < 0 or self.probe_subsets < 1:
            raise ConfigError("data.shuffle_buffer, data.cache_in_memory_gb and data.probe_labels_per_class "
                              "must be >= 0, data.probe_max_windows >= 2, data.probe_subsets >= 1")
