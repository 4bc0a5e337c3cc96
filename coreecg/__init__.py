"""coreecg: CoRe-ECG self-supervised pretraining of 12-lead ECG models."""
from __future__ import annotations

from coreecg.version import __version__  # a module of its own: data reads it without this file's API

# The built-in encoders and methods declare themselves (torch-free options modules) into the
# config's registries. Python runs this file before any coreecg.* module, so the config sees
# them without importing those packages (which import the config: docs/decisions.md).
from coreecg import encoders, methods  # noqa: F401

# Lazy imports: the loaders, on first call: `import coreecg` stays torch-free and light.

# The loaders import torch on first call, not here: `import coreecg` stays light. Each forwards
# to the one implementation (coreecg.loading; load_model adds the input contract, coreecg.hub).


def load_encoder(path, map_location="cpu"):
    """A ready `Encoder` (eval mode) from an export folder, a pretraining or fine-tuning run
    folder, encoder.pt, best.pt or a checkpoint (`coreecg.loading.load_encoder`)."""
    from coreecg.loading import load_encoder as _load

    return _load(path, map_location=map_location)


def load_classifier(path, map_location="cpu"):
    """A fine-tuned `Classifier` (eval mode) from a classifier export folder, best.pt or a
    fine-tuning run folder (`coreecg.loading.load_classifier`)."""
    from coreecg.loading import load_classifier as _load

    return _load(path, map_location=map_location)


def load_model(path, map_location="cpu"):
    """`coreecg.hub.LoadedModel` (model, kind, config, contract, source) of any model source."""
    from coreecg.hub import load_model as _load

    return _load(path, map_location=map_location)


def model_input(path, signal, fs, leads):
    """The windows the model at `path` is fed for one raw recording (leads, samples) in mV at `fs`
    Hz, rows named by `leads`: float32 (W, ...) in the model's own layout, batch axis first; a
    published family's under its own declared contract (`coreecg.hub.model_input`)."""
    from coreecg.hub import model_input as _model_input

    return _model_input(path, signal, fs, leads)


def embed(signal, fs=None, leads=None, model=None, *, device="cpu", precision=None):
    """One raw recording (leads, samples) in mV at `fs` Hz, rows named by `leads`, or a file's path
    (WFDB, DICOM, MUSE XML, HL7 aECG, EDF: `embed("ecg.xml", model=...)`) -> its embedding (D,),
    under the model's input contract, equal to jobs/predict.py's (`coreecg.inference.embed`);
    precision: auto, fp32, bf16, int8 as jobs/predict.py's --precision (None: the model's)."""
    from coreecg.inference import embed as _embed

    return _embed(signal, fs, leads, model, device=device, precision=precision)


def predict(signal, fs=None, leads=None, model=None, *, device="cpu", precision=None):
    """One raw recording (an array or a file's path, as for `embed`) -> a classifier's probabilities
    (K,), in its contract's class_names order, equal to jobs/predict.py's (`coreecg.inference.predict`)."""
    from coreecg.inference import predict as _predict

    return _predict(signal, fs, leads, model, device=device, precision=precision)


__all__ = ["__version__", "load_encoder", "load_classifier", "load_model", "model_input", "embed", "predict"]
