"""Pretrain CoRe-ECG.

    python jobs/pretrain.py --config configs/quickstart.yaml
    python jobs/pretrain.py --set data.corpus=corpora/mimic --set optim.epochs=80

Reads the train split of `data.corpus`, or the embedded synthetic corpus when it is empty.
Writes config.yaml, metrics.jsonl, TensorBoard events and checkpoint.pt to
train.output_dir; re-running with the same output_dir resumes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import config_parser, parse_config  # noqa: E402


def main(argv=None) -> int:
    args, cfg = parse_config(config_parser(__doc__.splitlines()[1]), argv)
    from coreecg.data import read_corpus_numpy, synthetic_windows
    from coreecg.train.loop import pretrain_local

    if cfg.data.corpus:
        windows = read_corpus_numpy(cfg.data.corpus, split="train")["signal"]
        print(f"corpus {cfg.data.corpus}: {len(windows)} training windows")
    else:
        windows, _ = synthetic_windows(cfg.data.synthetic_records, seed=cfg.data.sources.synthetic_seed,
                                        cfg=cfg.data.preprocess)
        print(f"embedded synthetic corpus: {len(windows)} windows")
    summary = pretrain_local(cfg, windows)
    print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in summary.items()}))
    print(f"checkpoint: {Path(cfg.train.output_dir) / 'checkpoint.pt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
