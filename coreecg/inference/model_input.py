"""What one loaded model takes (`input_spec`: its leads, preprocessing, crop rule, classes, from
its config and contract), and an encoder seen as a classifier (`PooledEncoder`) so that embeddings
go through the same crops and batching as a classifier's scores."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from coreecg.config import STANDARD_LEADS, Config, PreprocessConfig
from coreecg.inference.items import InferenceError
from coreecg.model.published.registry import model_layout
from coreecg.data.tasks import is_regression_task


@dataclass(frozen=True)
class ModelInput:
    """What one loaded model needs, from its config and contract (`input_spec`).

    preprocess: the config's preprocess section with `leads` = the model's leads (row order).
    crop: samples per model input; n_crops: evaluation crops per window; precision: autocast.
    """

    kind: str
    leads: tuple[str, ...]
    preprocess: PreprocessConfig
    crop: int
    n_crops: int
    precision: str
    class_names: tuple[str, ...]
    multilabel: bool | None
    regression: bool = False           # a regression task's head: values in the target's unit (coreecg.data.tasks)


def input_spec(loaded: Any) -> ModelInput:
    """A `coreecg.hub.LoadedModel` -> ModelInput; InferenceError where config and contract disagree.

    The preprocess section is the config's (hub resolves it to the corpus's settings); the contract
    names the leads, the stored window and the crop rule, and both must say the same.
    """
    cfg: Config = loaded.config
    c: dict[str, Any] = loaded.contract or {}
    kind = loaded.kind
    if kind not in ("encoder", "classifier"):
        raise InferenceError(f"{loaded.source}: unknown model kind {kind!r}")
    if kind == "classifier":
        leads = tuple(getattr(loaded.model, "leads", None) or c.get("leads") or cfg.finetune.leads)
    else:
        leads = tuple(c.get("leads") or STANDARD_LEADS[: cfg.model.n_leads])
    if c.get("leads") and tuple(c["leads"]) != leads:
        raise InferenceError(f"{loaded.source}: the model takes leads {list(leads)}, its contract says {c['leads']}")
    pre = dataclasses.replace(cfg.data.preprocess, leads=leads)
    checks = {"sampling_rate": pre.sampling_rate, "stored_window_samples": pre.window_samples,
              "window_samples": cfg.model.input_samples}
    wrong = [f"{k}: contract {c[k]}, config {v}" for k, v in checks.items() if k in c and c[k] != v]
    if wrong:
        raise InferenceError(f"{loaded.source}: contract and config disagree ({'; '.join(wrong)})")
    if cfg.model.input_samples > pre.window_samples:
        raise InferenceError(f"{loaded.source}: the model takes {cfg.model.input_samples} samples, longer than "
                             f"a preprocessed window ({pre.window_samples})")
    n_crops = int((c.get("aggregation") or {}).get("eval_crops") or cfg.finetune.eval_crops)
    names: tuple[str, ...] = ()
    multilabel = None
    if kind == "classifier":
        names, multilabel = tuple(c.get("class_names") or ()), c.get("multilabel")
        if not names or multilabel is None:
            raise InferenceError(f"{loaded.source}: a classifier without class names or task in its contract")
    return ModelInput(kind, leads, pre, cfg.model.input_samples, n_crops, cfg.train.precision, names,
                      None if multilabel is None else bool(multilabel),
                      kind == "classifier" and is_regression_task(cfg.finetune.task))


class PooledEncoder(nn.Module):
    """An Encoder seen through the three methods `downstream.predict` calls on a Classifier:
    features = pooled tokens of the given leads, an empty head, identity probabilities. So an
    embedding goes through the same crops and batching as a classifier's scores."""

    def __init__(self, encoder: nn.Module, leads: Sequence[str]):
        super().__init__()
        self.encoder = encoder
        self.register_buffer("lead_idx", torch.tensor([STANDARD_LEADS.index(x) for x in leads]), persistent=False)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, len(leads), T) -> (B, D)."""
        return self.encoder.pooled(*model_layout(self.encoder, x, self.lead_idx))

    def head(self, f: torch.Tensor) -> torch.Tensor:
        return f[:, :0]                           # (B, 0): no classes

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
