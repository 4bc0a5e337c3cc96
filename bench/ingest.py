"""Training ingest: the train split as a Ray Train worker reads it, materialised and streamed,
against plain pyarrow reading and decoding the same files.

    python -m bench.ingest                          # 2048 synthetic records, 3 epochs, batch 32
    python -m bench.ingest --corpus corpora/ptbxl --batch-size 256
    python -m bench.ingest --quick                  # 256 records, one epoch: a smoke run

The path is `coreecg.train.ingest.training_dataset` read through `epoch_batches` by rank 0 of
one worker (float16 batches, `data.shuffle_buffer`), both ways it can go: materialised in the
object store (`data.cache_in_memory_gb` above the split: Ray Train's split of the dataset) and
streamed from the shard files (`ShardFiles`, the cache set to 0). Figures per epoch (the first
counts building the dataset), the best epoch, and the ratio of the best to the best of
`--epochs` plain pyarrow passes (`ParquetFile.iter_batches` + decode to float32, one process).
The corpus is built (and cached under data.cache_dir) from --records synthetic records, or read
from --corpus. A corpus larger than memory: `python -m bench.large_corpus`.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch  # noqa: F401  here: decode_signals imports it on first use, which must not fall in a timed pass

from bench.common import (config_args, emit, ingest_pass, machine, parser, progress, pyarrow_pass,
                          worker_source)
from coreecg.config import load_config


def main() -> None:
    p = parser(__doc__, "256 synthetic records, one epoch and one pyarrow pass")
    config_args(p)
    p.add_argument("--corpus", help="a corpus folder (default: the embedded synthetic corpus)")
    p.add_argument("--records", type=int, default=2048, help="synthetic records (data.synthetic_records)")
    p.add_argument("--batch-size", type=int, default=32, help="one worker's batch")
    p.add_argument("--epochs", type=int, default=3, help="epochs of each path, and pyarrow passes")
    args = p.parse_args()
    if args.quick:
        args.records, args.epochs = 256, 1

    import ray

    from coreecg.cluster import init_ray, quiet_data
    from coreecg.data.corpus import load_manifest, split_files
    from coreecg.data.locate import training_corpus

    cfg = load_config(args.config, [f"data.synthetic_records={args.records}",
                                    *([f"data.corpus={Path(args.corpus).resolve()}"] if args.corpus else []),
                                    *args.set])
    init_ray()
    quiet_data()
    corpus = training_corpus(cfg)
    manifest = load_manifest(corpus)
    shape, dtype = tuple(manifest["signal"]["shape"]), manifest["signal"]["dtype"]
    passes = [pyarrow_pass(split_files(corpus, "train", manifest), shape, dtype) for _ in range(args.epochs)]
    pyarrow = max(x["windows_per_s"] for x in passes)
    out = {"benchmark": "ingest", **machine(), "corpus": str(corpus), "train_windows": passes[0]["windows"],
           "batch_size": args.batch_size, "shuffle_buffer": cfg.data.shuffle_buffer,
           "pyarrow_windows_per_s": pyarrow, "pyarrow_windows_per_s_per_pass": [x["windows_per_s"] for x in passes]}
    for mode, cache_gb in (("materialised", 1e9), ("streamed", 0.0)):
        t0 = time.perf_counter()
        source = worker_source(corpus, cache_gb, cfg.train.seed)
        epochs = [ingest_pass(source, args.batch_size, e, cfg.data.shuffle_buffer, cfg.data.crop_samples,
                              cfg.train.seed, t0 if e == 0 else None) for e in range(args.epochs)]
        rate = max(e["windows_per_s"] for e in epochs)
        out[mode] = {"windows_per_s": rate, "ratio_to_pyarrow": round(rate / pyarrow, 3), "epochs": epochs}
        progress({mode: rate})
    ray.shutdown()
    emit(out)


if __name__ == "__main__":
    main()
