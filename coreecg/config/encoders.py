"""The config's side of the encoder registry (coreecg.config.encoder_registry): the open `encoders`
section, one typed section per registered encoder that has options (`encoders.<name>`), and the
check that the method that trains can train the encoder `model.arch` names."""
from __future__ import annotations

from coreecg.config.base import ConfigError
from coreecg.typed import OpenSection
from coreecg.config.encoder_registry import ANY, encoder_spec, encoder_specs
from coreecg.config.method_registry import method_specs

__all__ = ["EncoderOptions", "check_encoder_for_method"]


class EncoderOptions(OpenSection):
    """The `encoders` section: `encoders.<name>.<key>` for every registered encoder with options
    (its sizes). A section not set holds its dataclass's defaults (the encoder's paper sizes)."""

    unknown_reason = "no registered encoder with options of that name; a plugin's module goes in plugins"

    @classmethod
    def section_type(cls, name: str) -> type | None:
        spec = encoder_specs().get(name)
        return spec.options if spec is not None else None

    @classmethod
    def known(cls) -> list[str]:
        return sorted(n for n, s in encoder_specs().items() if s.options is not None)

    def names(self, selected: str | None = None) -> list[str]:
        """The sections a saved config holds: the built-ins' (a published family's only when set or
        selected), those set and the selected encoder's (never one only because a plugin was
        imported in this process)."""
        specs = encoder_specs()
        keep = [*(n for n, s in specs.items() if s.built_in and not s.published), *self._sections,
                *([selected] if selected else [])]
        return [n for n in dict.fromkeys(keep) if n in specs and specs[n].options is not None]


def check_encoder_for_method(config) -> None:
    """ConfigError unless `pretrain.method` can train the encoder `model.arch` names (its output
    kind against the method's `needs`), or the encoder's sizes come from published weights. The
    error names the encoder, the method and the pairs that do work."""
    arch, method = config.model.arch, config.pretrain.method
    spec = encoder_spec(arch)
    if spec.published:
        raise ConfigError(f"model.arch={arch}: {spec.title}'s sizes come from its published weights; it is for "
                          "fine-tuning, predict and export, not pretrained here (model.arch=coreecg, or another "
                          f"registered encoder: {', '.join(n for n, s in encoder_specs().items() if not s.published)})")
    needs = getattr(config.method, "needs", ANY)
    if not spec.yields(needs):
        works = []
        for name, m in method_specs().items():
            encs = [e for e, s in encoder_specs().items() if not s.published and s.yields(getattr(m, "needs", ANY))]
            works.append(f"{name} on {', '.join(encs)}")
        meaning = "tokens on the (lead, time) grid, for its token masks" if needs == "grid" else "sequence over time"
        raise ConfigError(f"pretrain.method={method} needs an encoder whose output is a {needs} ({meaning}); "
                          f"model.arch={arch} ({spec.title}) yields a {spec.output}. "
                          f"Pairs that work: {'; '.join(works)}")
