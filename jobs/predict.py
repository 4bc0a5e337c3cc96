"""Score raw ECG recordings with a trained model: class probabilities or embeddings per record.

    python jobs/predict.py --model runs/ft-ptbxl --input ../shared/ecg-data/ptbxl --output preds/
    python jobs/predict.py --model exports/ft-ptbxl --input a.hea b.hea more/records/ --output out/p.csv
    python jobs/predict.py --model runs/quickstart --input ../shared/ecg-data/mimic-iv-ecg-layout --output emb/
    python jobs/predict.py --model runs/ft-ptbxl --input recs/ --output emb/ --embeddings
    python jobs/predict.py --model runs/quickstart --corpus corpora/mimic --output emb/ --workers 8

(runs/quickstart is a pretraining run: an encoder writes embeddings.)

--model: a fine-tuning run folder (best.pt), a pretraining run folder (encoder.pt), a .pt file or
an export folder (coreecg.hub.export_model). --input: files and folders. A folder of a database with its own
reader (PTB-XL's ptbxl_database.csv, MIMIC-IV-ECG's record_list.csv, CPSC2018's REFERENCE.csv)
is read by that reader (record ids as in its corpus); any other folder as WFDB records (every .hea
below it, ids relative to the folder); a file is one WFDB record (.hea, .dat or .mat).
--corpus: coreecg corpus folders (jobs/preprocess.py's output), scored from their stored windows,
every split or those of --split (a corpus folder given to --input is read the same way).

--workers N spreads reading, preprocessing and scoring over N Ray actors (one CPU each, or one
GPU with --device cuda) on the cluster coreecg.cluster joins or starts; the outputs are those of
one process (--workers 0, the default, without Ray), bit for bit on the CPU. With --device auto
(the default) the cluster decides: GPU actors where it has a GPU per worker (this machine's GPUs
for its own local cluster, Ray's count on a joined one), else CPU actors; the console's first
line says which and why. Records go to the
actors in tasks of --records-per-task records (a corpus shard is a task of its own); --workers
needs Ray (`pip install 'coreecg[ray]'`), and with --device cuda a GPU per worker.

Each record is preprocessed exactly as training's corpus was (coreecg.data.preprocess, with the
model's saved settings), its leads picked by name (a model fine-tuned on 6 or 1 leads takes
those), and scored under the fine-tuning evaluation's crop rule; a record's score is the mean
over its 10 s windows (docs/inference.md).

Outputs (--output FOLDER, or a file name in it):
    predictions.csv      a classifier: record_id, path, p_<class> per class (the columns and number
                         format of a fine-tuning run's predictions.csv): softmax (single-label)
                         or sigmoid (multi-label) probabilities
    embeddings.parquet   an encoder, or --embeddings: record_id, path, embedding (float32 list of
                         the encoder's width): the pooled token encodings, averaged as above
    failed.csv           record_id, path, reason for every record (or input) that gave no output;
                         only when one failed (an earlier run's copy is removed); the console lists them

Exit codes: 0 every record predicted, 1 some records failed (the others are written), 2 bad
arguments, a model that cannot be loaded, or no readable input (nothing written but failed.csv).
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from coreecg.cli import fail, job_parser, parse_args

# Lazy imports: in main and score, so that --help stays as light as it is (204 modules): the model side
# (devices, hub, inference: torch, about 2,600 modules), the Ray actors (coreecg.inference.distributed: ray),
# and coreecg.cluster and coreecg.extras (2 modules more, 3 ms).

parser = job_parser(__doc__, config=False)
parser.add_argument("--model", required=True, metavar="PATH",
                    help="the model: a fine-tuning or pretraining run folder, best.pt / encoder.pt, or an export "
                         "folder")
parser.add_argument("--input", nargs="+", default=[], metavar="FILES_OR_FOLDER",
                    help="WFDB record files (.hea/.dat/.mat) and folders (a known database layout or any WFDB tree)")
parser.add_argument("--output", required=True, metavar="F",
                    help="folder for predictions.csv / embeddings.parquet (and failed.csv), or that file's name")
parser.add_argument("--embeddings", action="store_true",
                    help="write a classifier's encoder embeddings (embeddings.parquet) instead of probabilities")
parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                    help="windows per forward pass, always exactly N (each as the crop rule's crops), so a "
                         "record scores the same whatever shares its pass (docs/inference.md); default 8")
parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                    help="where the model runs (auto: cuda when available; with --workers, GPU actors where the "
                         "cluster has a GPU per worker)")
parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "int8"), default=None,
                    help="the inference path (default: the model's inference.precision, auto): bf16 where the processor"
                         " has bf16 units (detected), int8 (dynamic, Linear layers) when asked; a path over the"
                         " model's bounds is refused (docs/inference.md \"Precision\")")
parser.add_argument("--threads", type=int, default=None, metavar="N",
                    help="torch threads of this process (default: the model's inference.threads, 0: torch's default)")
parser.add_argument("--compile", choices=("auto", "true", "false"), default=None,
                    help="compile the feature pass (inductor, frozen weights; default: the model's "
                         "inference.compile, auto: on a CPU from inference.compile_min_windows windows, 2000, timed; "
                         "docs/inference.md \"Compiled\")")
parser.add_argument("--workers", type=int, default=0, metavar="N",
                    help="Ray actors that read, preprocess and score (one CPU or GPU each); 0: one process, "
                         "no Ray")
parser.add_argument("--records-per-task", type=int, default=None, metavar="N",
                    help="with --workers: raw records an actor scores per task (fewer: more, smaller tasks to "
                         "share among the workers); default 16, or 2 forward passes' windows if more")
parser.add_argument("--corpus", nargs="+", default=[], metavar="DIR",
                    help="preprocessed corpus folders (manifest.json) to score from their stored windows")
parser.add_argument("--split", nargs="+", default=None, choices=("train", "val", "test"), metavar="SPLIT",
                    help="the corpus split(s) to score: train, val, test (default: all)")


def output_file(output: str, name: str) -> Path:
    """--output as the file to write: FOLDER/name for a folder (existing, ending in '/', or without
    a suffix), else the file itself, which must have `name`'s suffix (ValueError otherwise)."""
    out = Path(output).expanduser()
    if out.is_dir() or output.endswith(("/", "\\")) or not out.suffix:
        return out / name
    if out.suffix.lower() != Path(name).suffix:
        raise ValueError(f"--output {output}: this model writes {name} ({Path(name).suffix}); give a folder "
                         f"or a {Path(name).suffix} file")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(parser, argv)
    from coreecg.devices import DeviceError, resolve_device
    from coreecg.hub import load_model
    from coreecg.inference import (
        EMBEDDINGS_FILE, FAILED_FILE, PREDICTIONS_FILE, InferenceError, list_inputs, write_embeddings_parquet,
        write_failures_csv, write_predictions_csv,
    )

    if args.batch_size is not None and args.batch_size < 1:
        return fail(f"--batch-size {args.batch_size}: must be >= 1")
    if args.workers < 0:
        return fail(f"--workers {args.workers}: must be >= 0")
    if args.threads is not None and args.threads < 0:
        return fail(f"--threads {args.threads}: must be >= 0")
    if args.records_per_task is not None and args.records_per_task < 1:
        return fail(f"--records-per-task {args.records_per_task}: must be >= 1")
    if args.workers:
        from coreecg.extras import MissingExtra, require_ray_extra

        try:                                    # before the model loads: the light install has no Ray
            require_ray_extra("--workers (Ray Data actors)")
        except MissingExtra as e:
            return fail(str(e))
    if not args.input and not args.corpus:
        return fail("nothing to score: give --input FILES_OR_FOLDER and/or --corpus CORPUS")
    not_corpus = [c for c in args.corpus if not (Path(c).expanduser() / "manifest.json").is_file()]
    if not_corpus:
        return fail(f"--corpus {not_corpus[0]}: not a coreecg corpus (no manifest.json)")
    try:                                        # --workers with auto: the cluster's GPUs decide (score)
        device = None if args.workers and args.device == "auto" else resolve_device(args.device)
    except DeviceError as e:
        return fail(str(e))
    try:
        loaded = load_model(args.model, map_location="cpu")
    except (ValueError, OSError) as e:           # CheckpointError is a ValueError naming the file
        return fail(f"--model {args.model}: {e}")
    compile_ = {"true": True, "false": False}.get(args.compile, args.compile)     # as train.compile: a bool or auto
    given = {k: v for k, v in (("threads", args.threads), ("compile", compile_)) if v is not None}
    if given:
        import dataclasses

        loaded.config = dataclasses.replace(loaded.config, inference=dataclasses.replace(
            loaded.config.inference, **given))
    embeddings = args.embeddings or loaded.kind == "encoder"
    try:
        target = output_file(args.output, EMBEDDINGS_FILE if embeddings else PREDICTIONS_FILE)
    except ValueError as e:
        return fail(str(e))

    sources = [*args.input, *args.corpus]
    items, failures = list_inputs(sources, loaded.config, splits=args.split)
    if not items:
        _print_failures(failures)
        return fail("no readable input: no record was found in " + ", ".join(sources))
    from coreecg.cluster import ClusterError

    try:
        result = score(loaded, items, failures, args, embeddings, device)
    except InferenceError as e:                 # it names the model's file
        return fail(str(e))
    except ClusterError as e:                   # --workers: no cluster answers, or too few GPUs
        return fail(str(e))

    target.parent.mkdir(parents=True, exist_ok=True)
    failed_csv = target.parent / FAILED_FILE
    if result.failures:
        write_failures_csv(failed_csv, result.failures)
    else:
        failed_csv.unlink(missing_ok=True)      # an earlier run's list would be read as this one's
    _print_failures(result.failures)
    if not result.record_id:
        return fail(f"no readable input: all {len(items)} record(s) failed (see {failed_csv})")
    if embeddings:
        meta = {"coreecg": json.dumps({"model": str(loaded.source), "kind": loaded.kind,
                                       "leads": list(loaded.contract.get("leads", [])),
                                       "dim": int(result.embeddings.shape[1]), "precision": result.precision,
                                       "compiled": result.compiled})}
        write_embeddings_parquet(target, result, meta)
    else:
        write_predictions_csv(target, result)
    print(f"{len(result.record_id)} record(s) predicted -> {target} ({result.precision}: {result.precision_reason}); "
          f"{result.compile_reason}")
    if result.failures:
        print(f"{len(result.failures)} failed -> {failed_csv}")
        return 1
    return 0


def score(loaded, items, failures, args, embeddings: bool, device):
    """In this process (--workers 0), or on N Ray actors (the same InferenceResult)."""
    from coreecg.inference import run_inference

    if args.workers == 0:
        return run_inference(loaded, items, embeddings=embeddings, batch_size=args.batch_size, device=device,
                             failures=failures, precision=args.precision)
    from coreecg.cluster import find_devices, init_ray, plan_actors
    from coreecg.inference.distributed import run_inference_ray

    # device None: --device auto, chosen from the GPUs of the cluster the actors run on
    devices = find_devices()                    # joins a shared cluster; else before this job's own starts
    actor_device, lines = plan_actors("auto" if device is None else device.type, args.workers, devices)
    for line in lines:
        logging.getLogger("coreecg.inference").info("%s", line)
    gpu = actor_device == "cuda"
    init_ray(0 if gpu else args.workers, reserve_for_data=1, gpus=devices.gpus)   # actors' CPUs + one for Ray Data
    return run_inference_ray(loaded, items, workers=args.workers, embeddings=embeddings,
                             batch_size=args.batch_size, device=actor_device, failures=failures,
                             records_per_task=args.records_per_task, precision=args.precision)


def _print_failures(failures) -> None:
    for f in failures:
        print(f"failed: {f.record_id} ({f.path}): {f.reason}", file=sys.stderr)


def build_parser():
    """This job's parser (tests/test_vocabulary.py reads every job's)."""
    return parser


if __name__ == "__main__":
    sys.exit(main())
