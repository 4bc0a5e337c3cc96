"""The encoder registry: `model.arch` name -> `EncoderSpec` (its title, options section, output kind,
input contract and, once its module is imported, its class). Part of the config package and a leaf
of it (it imports nothing of coreecg but the config's error type), so the config checks a (method,
encoder) pair without torch; its documented home `coreecg.encoders.registry` re-exports it.

Who fills it: the built-ins declare themselves in the torch-free `coreecg/encoders/options.py`
(imported by `coreecg/encoders/__init__.py`, which `coreecg/__init__.py` imports: Python runs it
before any `coreecg.*` module); their classes bind when their modules are imported
(`coreecg.encoders.build`). A plugin's one module declares and binds at once (`register_encoder`).

Output kinds (what an encoder yields and so which methods can train it):

- GRID: tokens on the (lead, time) grid (`Encoded` with grid (C, N)); takes `visible` token masks,
  so masked modelling (STDM, the reconstruction rows) can train it. The paper's ViT.
- SEQUENCE: a sequence over time (`Encoded` with grid (1, L)); no token masks. CNNs and
  state-space models.
A method declares what it needs (`MethodSpec.needs`): GRID, SEQUENCE or ANY (pooled features, or
an encoder of each kind handled by the method itself: CPC).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from coreecg.config.base import ConfigError

GRID, SEQUENCE, ANY = "grid", "sequence", "any"
OUTPUT_KINDS = (GRID, SEQUENCE)


@dataclass(frozen=True)
class EncoderSpec:
    """What the rest of coreecg knows of an encoder, without building it.

    name: `model.arch`; title: for messages, tables and model cards; output: GRID or SEQUENCE;
    options: the dataclass of its section `encoders.<name>` (its sizes; None: it has none);
    module: where its class lives (imported on
    first build); published: its sizes come from another project's weights (not pretrained here);
    input: its input contract in words (leads, samples: for errors and model cards).
    Parameter groups for layer-wise decay: an encoder names its stacked blocks `blocks.<i>.`
    (coreecg.train.optim reads the depth from those names).
    """

    name: str
    title: str
    output: str
    options: type | None = None
    module: str = ""
    published: bool = False
    input: str = "(B, C, T): any subset of the 12 standard leads (lead_idx), T = model.input_samples"
    cls: type | None = None

    @property
    def built_in(self) -> bool:
        return self.module.startswith("coreecg.")

    def yields(self, needs: str) -> bool:
        """Whether this encoder gives what a method that `needs` it trains on."""
        return needs == ANY or needs == self.output


ENCODERS: dict[str, EncoderSpec] = {}


def declare_encoder(spec: EncoderSpec) -> EncoderSpec:
    """Add `spec` to the registry; ConfigError for a name that is no lower-case identifier, an
    unknown output kind, options that are no dataclass, or a name another class holds."""
    if not spec.name.isidentifier() or spec.name != spec.name.lower():
        raise ConfigError(f"encoder name {spec.name!r} must be a lower-case identifier (it is model.arch)")
    if spec.output not in OUTPUT_KINDS:
        raise ConfigError(f"encoder {spec.name!r}: output {spec.output!r} is not one of {OUTPUT_KINDS}")
    if spec.options is not None and not dataclasses.is_dataclass(spec.options):
        raise ConfigError(f"encoder {spec.name!r}: options must be a dataclass, got {spec.options!r}")
    known = ENCODERS.get(spec.name)
    if known is not None and known.cls is not None and spec.cls is not None and known.cls is not spec.cls:
        raise ConfigError(f"encoder {spec.name!r} is already registered by {known.cls.__module__}")
    ENCODERS[spec.name] = spec
    return spec


def encoder_specs() -> dict[str, EncoderSpec]:
    return ENCODERS


def encoder_spec(name: str) -> EncoderSpec:
    """The registered encoder `name`; ConfigError naming the known ones and where a plugin goes."""
    if name not in ENCODERS:
        raise ConfigError(f"model.arch={name!r} is not a registered encoder; known: {', '.join(ENCODERS)} "
                          "(an encoder of your own: its module in `plugins`, docs/encoders.md)")
    return ENCODERS[name]


def is_published(arch: str) -> bool:
    """Whether `model.arch` names a published family (sizes from its weights, not trained here)."""
    spec = ENCODERS.get(arch)
    return spec is not None and spec.published
