"""The published families' registry (`coreecg.model.published`): a family module calls
`register(PublishedFamily(...))`; loading, export and fine-tuning look a family up by name or by a
checkpoint's keys (`recognise`). A leaf of the package, so a family module imports it without
running the package that imports the families."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from coreecg.config import Config, ModelConfig, PreprocessConfig
from coreecg.config.encoder_registry import encoder_spec
from coreecg.config.encoders import EncoderOptions

COREECG = "coreecg"


def model_entry(entries: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The default container: a dict whose "model" entry is the state dict (or a bare state dict),
    its own "config" entry the recorded sizes. -> (candidate state, recorded config)."""
    state = entries.get("model", entries)
    recorded = entries.get("config") if isinstance(entries.get("config"), dict) else None
    return (state if isinstance(state, dict) else None), recorded


@dataclass(frozen=True)
class PublishedFamily:
    name: str                                                    # model.arch
    title: str                                                   # for messages and model cards
    label: str                                                   # the method name in report tables
    recognise: Callable[[dict[str, Any]], dict[str, Any] | None]
    read_architecture: Callable[[dict[str, Any], dict[str, Any] | None], Config]
    build: Callable[[Config], nn.Module]
    preprocess: PreprocessConfig
    module: str                                                  # the class, as export config.json names it
    licence: str = ""
    pooling: str = ""
    normalisation: str = ""
    pretraining: str = ""
    # the file's container -> (candidate state dict, recorded config): a `files.Payload` in, so a
    # family reads its own entries ("state_dict", "encoder", "cfg") and a folder's config.json
    unpack: Callable[[Any], tuple[dict[str, Any] | None, dict[str, Any] | None]] | None = None
    contract: Any = None                                         # coreecg.data.contract.InputContract
    variants: tuple[Any, ...] = ()                               # other files' contracts (ECGFounder's 1-lead)
    pretrained_on: tuple[str, ...] = ()                          # databases (source names) the weights saw
    commercial_use: bool = True                                  # False: non-commercial weights
    releases: tuple[tuple[str, str], ...] = ()                   # (released file or folder name, where to get it)


FAMILIES: dict[str, PublishedFamily] = {}


def register(family: PublishedFamily) -> PublishedFamily:
    if family.name == COREECG or family.name in FAMILIES:
        raise ValueError(f"published encoder family {family.name!r} is already registered")
    FAMILIES[family.name] = family
    return family


def contract_of(fam: PublishedFamily, n_leads: int | None = None, leads: tuple[str, ...] | None = None) -> Any:
    """The family's contract for a file of `n_leads` leads (or those `leads`): its main one, or the
    variant that takes them (ECGFounder's 1-lead file); None when it declares none."""
    if fam.contract is None:
        return None
    for c in (fam.contract, *fam.variants):
        if (leads is None or tuple(c.leads) == tuple(leads)) and (n_leads is None or len(c.leads) == n_leads):
            return c
    raise ValueError(f"{fam.title}: no declared contract for {list(leads) if leads else f'{n_leads} leads'}; it "
                     f"declares {[list(c.leads) for c in (fam.contract, *fam.variants)]}")


def contract_preprocess(fam: PublishedFamily, n_leads: int | None = None) -> PreprocessConfig:
    """The data.preprocess of a corpus built under the family's declared contract (for a file of
    `n_leads` leads): its stored form's rate, window and leads, and `contract` naming the family
    (coreecg.data.preprocess.contract_windows); the family's closest standard settings (`preprocess`)
    when it declares no contract."""
    c = contract_of(fam, n_leads)
    if c is None:
        return fam.preprocess
    rate, n = c.stored_rate(), c.stored_samples()
    return PreprocessConfig(sampling_rate=int(rate), window_s=n / rate, leads=tuple(c.leads), contract=fam.name,
                            min_duration_s=min(PreprocessConfig.min_duration_s, n / rate))


def model_layout(encoder: nn.Module, x: Any, lead_idx: Any = None) -> tuple[Any, Any]:
    """A batch in coreecg's stored form (B, C, T) and its rows' standard-lead indices -> what
    `encoder` takes: for a published family with a contract, its layout (xECG time-major, HuBERT-ECG
    flat; `InputContract.to_model`) and no lead_idx (a contract corpus's rows are the model's own,
    in its order: MERL's aVF before aVL); anything else unchanged. What a Classifier and an embedding
    pass call before the encoder, so a contract corpus feeds any family."""
    fam = FAMILIES.get(getattr(type(encoder), "encoder_name", ""))
    if fam is None or fam.contract is None:
        return x, lead_idx
    return contract_of(fam, getattr(encoder, "n_leads", None)).to_model(x), None


def release_hint(path: str) -> str:
    """Where the released file or folder a path names is downloaded ("" when no family releases it)."""
    name = str(path).rstrip("/").rsplit("/", 1)[-1]
    for fam in FAMILIES.values():
        for released, where in fam.releases:
            if released == name:
                return f"{name} is {fam.title}'s released weights: download it from {where}"
    return ""


def published_config(name: str, file: str = "", n_leads: int | None = None) -> dict[str, Any]:
    """The `model` and `encoders` sections of family `name` at a released size: its options' defaults
    (the published model), or the named release a file name says (`releases_by_file`: MERL's ViT-tiny);
    for pricing and benchmarks without the weights (bench.capacity --stand-in-data)."""
    fam = family(name)
    options_type = encoder_spec(name).options
    release = RELEASE_SIZES.get(file)
    options = options_type.release(release) if release else options_type()
    contract = contract_of(fam, n_leads)
    model = (ModelConfig(arch=name, n_leads=len(contract.leads), input_samples=contract.stored_samples())
             if contract is not None else ModelConfig(arch=name, n_leads=n_leads or 12))   # ST-MEM: 2250 at 250 Hz
    return {"model": model, "encoders": EncoderOptions({name: options})}


# A released file whose size is not its family's options defaults: its release name there.
RELEASE_SIZES = {"vit_tiny_best_encoder.pth": "vit_tiny"}


def family(name: str) -> PublishedFamily:
    """The registered family `name`; KeyError naming the known ones."""
    if name not in FAMILIES:
        raise KeyError(f"unknown model.arch {name!r}: no published family of that name; known: "
                       f"{', '.join([COREECG, *FAMILIES])} (an encoder of your own: its module in `plugins`, "
                       "docs/encoders.md)")
    return FAMILIES[name]


def recognise(payload: Any) -> tuple[PublishedFamily, dict[str, Any], Config] | None:
    """A published file's contents (a `coreecg.model.published.files.Payload`, or a torch.load'ed
    dict: a dict with a "model" state dict, or a bare state dict) -> (its family, the encoder's
    state, its config: model and encoders.<family>); None when no family knows its keys.
    ValueError when a family knows the keys but they do not fit together (a key missing, a shape)."""
    entries = getattr(payload, "entries", payload)
    if not isinstance(entries, dict):
        return None
    for fam in FAMILIES.values():
        if fam.unpack is not None:
            if not hasattr(payload, "entries"):
                continue                 # a family with its own container reads a Payload only
            state, recorded = fam.unpack(payload)
        else:
            state, recorded = model_entry(entries)
        if not isinstance(state, dict):
            continue
        sub = fam.recognise(state)
        if sub is not None:
            return fam, sub, fam.read_architecture(sub, recorded)
    return None
