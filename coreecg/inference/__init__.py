"""Inference without Ray: raw ECG recordings in, class probabilities or embeddings per record out.

    from coreecg.hub import load_model
    from coreecg.inference import list_inputs, run_inference

    loaded = load_model("runs/ft-ptbxl")                  # a run folder, best.pt, encoder.pt or an export
    items, failures = list_inputs(["../shared/ecg-data/ptbxl", "more/records/"], loaded.config)
    result = run_inference(loaded, items, failures=failures)
    result.probs        # (records, classes) for a classifier; result.embeddings for an encoder
    result.failures     # [Failure(record_id, path, reason)]: the rest went on

Every step is the training code's own, so a record scores exactly as the fine-tuning evaluation
scored it (predictions.csv) when it is the same recording:

1. listing     a folder of a database with its own reader (an index file `known_layout` names:
               PTB-XL, MIMIC-IV-ECG, CPSC2018) goes through that reader, in its label-free view
               (record ids as the corpus has them); any other folder through the generic WFDB
               reader (`WfdbFolderSource`); a file is one WFDB record (`.hea`, `.dat`, `.mat`).
               A coreecg corpus folder (manifest.json) is listed as its shard files
               (`CorpusShard`): its windows are already steps 2-3, so they are scored as stored.
2. preprocess  `coreecg.data.preprocess.preprocess_record` with the model's config's preprocess
               section (as hub.load_model resolves it: the corpus's settings the weights saw),
               its leads narrowed to the model's leads: leads are picked BY NAME, so a 6-lead
               model takes I, II, III, aVR, aVL, aVF from a file in any lead order, and a record
               without one of them fails with "missing lead(s) ...".
3. storage     windows are rounded to the corpus's storage dtype (float16), as training and the
               evaluation read them: the inputs the weights saw (the rounding is ~2e-4 of a
               z-scored sample; with it, scores equal predictions.csv to its printed digits).
4. model       `coreecg.eval.downstream.predict`: the crop rule (mean of the logits of
               `eval_crops` evenly spaced crops of each window, then softmax / sigmoid), in
               forward passes of exactly `batch_size` windows (run_inference says why); an
               encoder gives the crop mean of its pooled tokens instead.
5. record      `coreecg.eval.metrics.aggregate_by_record`: the mean over a record's windows.

A record that cannot be read or preprocessed is a `Failure` with the reader's or preprocessing's
reason; the others go on. Progress goes to the `coreecg.inference` logger every few seconds.

`embed(signal, fs, leads, model)` / `predict(...)` run one in-memory recording through the same
steps 2-5 (a `Record` is an item like a listed file). None of this imports Ray: the same
per-record work spread over a cluster is `coreecg.inference.distributed` (not imported here).

One idea per module: `items` (what is passed around), `model_input` (what a model takes),
`listing` (step 1), `reading` (steps 2-3), `engine` (steps 4-5, `run_inference`), `in_memory`
(`embed` / `predict`), `writers` (the output files), `distributed` (Ray Data actors).
"""
from __future__ import annotations

from coreecg.inference.engine import predict_paths, run_inference
from coreecg.inference.in_memory import array_record, embed, predict
from coreecg.inference.items import CorpusShard, Failure, InferenceError, InferenceResult, InputRecord
from coreecg.inference.listing import list_corpus, list_inputs, source_options
from coreecg.inference.model_input import ModelInput, input_spec
from coreecg.inference.reading import prepare, shard_windows
from coreecg.inference.writers import (
    EMBEDDINGS_FILE, FAILED_FILE, PREDICTIONS_FILE, write_embeddings_parquet, write_failures_csv,
    write_predictions_csv,
)

# Every name the single module exported, importable from here as before (not in __all__): re-exports.
from coreecg.inference.engine import FORWARD_WINDOWS, Progress, log  # noqa: F401
from coreecg.inference.items import Item  # noqa: F401

__all__ = ["InputRecord", "CorpusShard", "Failure", "InferenceResult", "InferenceError", "ModelInput", "input_spec",
           "source_options", "list_inputs", "list_corpus", "prepare", "shard_windows", "run_inference",
           "predict_paths", "array_record", "embed", "predict",
           "write_predictions_csv", "write_embeddings_parquet", "write_failures_csv",
           "PREDICTIONS_FILE", "EMBEDDINGS_FILE", "FAILED_FILE"]
