"""Pretrain CoRe-ECG on Ray Train (TorchTrainer workers fed by Ray Data).

    python jobs/pretrain.py                                   # quickstart: synthetic corpus, 2 CPU workers
    python jobs/pretrain.py --config configs/paper.yaml --set data.corpus=corpora/mimic \\
        --set train.num_workers=4 --set train.use_gpu=true    # the paper's run on a GPU node
    ray job submit --working-dir . -- python jobs/pretrain.py ...   # on a running cluster

Without --config the quickstart config (configs/quickstart.yaml) applies; `configs/paper.yaml`
is the paper's setting. Reads the train split of `data.corpus`, or the embedded synthetic
corpus (written as Parquet under data.cache_dir on first use) when it is empty. Writes to
<train.storage_path>/<train.name>/; re-running with the same storage path and name resumes.
Exit codes: 0 done, 2 bad config or input, 1 training failed.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import config_parser, parse_config  # noqa: E402

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"


def main(argv=None) -> int:
    parser = config_parser(__doc__.splitlines()[0])
    parser.set_defaults(config=str(DEFAULT_CONFIG))
    args, cfg = parse_config(parser, argv)
    from coreecg.data.corpus import CorpusError
    from coreecg.train.checkpoint import CheckpointError
    from coreecg.train.distributed import pretrain

    try:
        result = pretrain(cfg)
    except (CheckpointError, CorpusError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:   # ray.train.TrainingFailedError and friends: the cause, not the traceback
        cause = getattr(e, "__cause__", None) or e
        if isinstance(cause, (CheckpointError, CorpusError)):
            print(f"error: {cause}", file=sys.stderr)
            return 2
        raise
    run = result.run_dir
    m = result.metrics
    summary = ", ".join(f"{k} {m[k]:.4f}" for k in ("loss_rec", "loss_con", "probe_auroc", "probe_auroc_init")
                        if isinstance(m.get(k), float))
    print(f"\ndone: step {m.get('step')}, {summary}")
    print(f"run folder:   {run}")
    print(f"  config:     {run / 'config.yaml'}")
    print(f"  metrics:    {run / 'metrics.jsonl'}")
    print(f"  tensorboard: {run / 'tensorboard'}  (view: pip install tensorboard; tensorboard --logdir ...)")
    print(f"  figures:    {run / 'figures'}")
    print(f"  checkpoint: {result.checkpoint}")
    print(f"  encoder:    {result.encoder}  (coreecg.load_encoder reads it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
