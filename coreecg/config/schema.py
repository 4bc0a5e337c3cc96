"""`Config`: every section, the checks across sections, and its plain/YAML form."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coreecg.typed import to_plain
from coreecg.config.base import ConfigError
from coreecg.config.data import DataConfig
from coreecg.config.sections import InferenceConfig, ModelConfig, OptimConfig, TrainConfig
from coreecg.config.downstream import FinetuneConfig, ReportConfig
from coreecg.config.methods import MethodOptions, MethodSpec, PretrainConfig, method_specs
from coreecg.config.encoders import EncoderOptions
from coreecg.config.plugins import import_plugins
from coreecg.config.encoder_registry import encoder_spec


@dataclass
class Config:
    # Modules imported before anything is looked up (on the driver and on every worker): each may
    # register sources, methods or report tables (docs/data_sources.md, "Adding a source").
    plugins: tuple[str, ...] = ()
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)     # before methods: plugins add sections
    methods: MethodOptions = field(default_factory=MethodOptions)
    # One typed section per registered encoder with options (its sizes); model.arch selects one
    encoders: EncoderOptions = field(default_factory=EncoderOptions)
    report: ReportConfig = field(default_factory=ReportConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)   # scoring records (jobs/predict.py)

    def __post_init__(self) -> None:
        import_plugins(self.plugins, "plugins")

    @property
    def method(self) -> MethodSpec:
        """The registry entry of the method that trains (`pretrain.method`)."""
        return method_specs()[self.pretrain.method]

    @property
    def method_label(self) -> str:
        """The name downstream tables list this run's encoder under."""
        return self.train.variant or self.method.label

    @property
    def method_options(self) -> Any:
        """The selected method's options section (None for a method without one)."""
        return getattr(self.methods, self.pretrain.method) if self.method.options is not None else None

    @property
    def encoder(self) -> Any:
        """The selected encoder's options section, `encoders.<model.arch>` (None for an encoder
        without one)."""
        return getattr(self.encoders, self.model.arch) if encoder_spec(self.model.arch).options is not None else None

    @property
    def patch_size(self) -> int:
        """Samples per token along time of the (lead, time) grid: the selected encoder's
        `patch_size`, else the paper ViT's (`encoders.coreecg.patch_size`: the grid a sequence
        encoder's run still shares, e.g. CMSC's segments and the short-record rule)."""
        return getattr(self.encoder, "patch_size", None) or self.encoders.coreecg.patch_size

    @property
    def n_patches(self) -> int:
        """Tokens per lead along time: model.input_samples / patch_size."""
        return self.model.input_samples // self.patch_size

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        out["methods"] = {n: to_plain(getattr(self.methods, n)) for n in self.methods.names(self.pretrain.method)}
        out["encoders"] = {n: to_plain(getattr(self.encoders, n)) for n in self.encoders.names(self.model.arch)}
        return out

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        return text

    @property
    def patch_key(self) -> str:
        """The dotted key `patch_size` comes from (errors name it)."""
        arch = self.model.arch if getattr(self.encoder, "patch_size", None) else "coreecg"
        return f"encoders.{arch}.patch_size"

    def validate(self) -> "Config":
        """Checks across sections (each section checks its own keys when built), then the
        training method's own cross-checks (`check(config)` of its options, if it has one)."""
        m = self.model
        encoder_spec(m.arch)          # a registered encoder (coreecg.encoders), or the error names them
        if m.arch in self.encoders.names(m.arch):     # its own sections' keys that go together
            try:
                getattr(getattr(self.encoders, m.arch), "check", lambda: None)()
            except ConfigError as e:                   # named by its section, as a key's own error is
                raise ConfigError(str(e) if str(e).startswith("encoders.") else f"encoders.{m.arch}: {e}") from None
        # a published family's input is its contract's window, whatever its token stride
        if m.input_samples % self.patch_size and not encoder_spec(m.arch).published:
            raise ConfigError(f"model.input_samples={m.input_samples} is not a multiple of {self.patch_key}="
                              f"{self.patch_size}")
        if self.data.crop_samples != m.input_samples:
            raise ConfigError(f"data.crop_samples={self.data.crop_samples} must equal "
                              f"model.input_samples={m.input_samples}")
        if self.data.crop_samples > self.data.preprocess.window_samples:
            raise ConfigError("data.crop_samples exceeds the stored window length")
        d = self.data
        if d.corpus_weights and len(d.corpus_weights) != len(d.corpora):
            raise ConfigError(f"data.corpus_weights={list(d.corpus_weights)}: one weight per corpus of data.corpus "
                              f"({len(d.corpora)})")
        pre = self.data.preprocess
        if pre.min_duration_s * pre.sampling_rate < self.patch_size:
            raise ConfigError(f"data.preprocess.min_duration_s={pre.min_duration_s} keeps records shorter than "
                              f"one patch ({self.patch_key}={self.patch_size} samples at {pre.sampling_rate} Hz)")
        for what, batch in (("finetune", self.finetune.batch_size), ("optim", self.optim.batch_size)):
            # train.num_workers=auto: checked on the resolved config (coreecg.cluster.resolve_devices)
            if isinstance(self.train.num_workers, int) and batch % self.train.num_workers:
                raise ConfigError(f"{what}.batch_size={batch} (the global batch) is not divisible "
                                  f"by train.num_workers={self.train.num_workers}")
        check = getattr(self.method_options, "check", None)
        if callable(check):
            check(self)
        return self
