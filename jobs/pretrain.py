"""Pretrain an ECG encoder (CoRe-ECG by default, or a baseline) on Ray Train: TorchTrainer
workers fed by Ray Data, checkpoints every epoch, resumable.

    python jobs/pretrain.py                                   # quickstart: synthetic corpus, this machine's devices
    python jobs/pretrain.py --corpus corpora/ptbxl --output runs/ptbxl-core
    python jobs/pretrain.py --config configs/paper.yaml --corpus corpora/mimic   # a GPU node: one worker per GPU
    python jobs/pretrain.py --set train.use_gpu=false --set train.num_workers=4  # the CPU, 4 workers, whatever the node
    python jobs/pretrain.py --set pretrain.method=moco_v3 --output runs/moco   # a baseline
    python jobs/pretrain.py --print-config                    # the resolved config, nothing run
    ray job submit --working-dir . -- python jobs/pretrain.py --output $PWD/runs/x ...   # on a cluster

Without --config the quickstart config (configs/quickstart.yaml: a small model on the embedded
synthetic corpus, about 5 minutes on 2 cores) applies; configs/paper.yaml is the paper's setting.
Reads the train split of --corpus (data.corpus), or the embedded synthetic corpus (written as
Parquet under data.cache_dir on first use) when none is given.

Devices: train.use_gpu and train.num_workers default to auto, chosen once before Ray starts from
the GPUs of the cluster the job runs on (this machine's, for the job's own local cluster; Ray's
count on a joined one): the GPUs with one worker each, else the CPU with 2 workers. A value set
(--config, --set) is kept. The console's first line says what was chosen and why; config.yaml
and run.json record the chosen values (a resumed auto run compares equal to itself). On a GPU
the step is compiled (train.compile=auto: torch.compile per transformer block, docs/decisions.md
"Compiled step"); configs/quickstart.yaml keeps it off, as so short a run would not win back the
compile time.

Merge order: defaults < --config < --set < this job's flags. --corpus is data.corpus, --output
is train.storage_path + train.name; a key given both ways is an error (exit 2).

Writes to --output (default <train.storage_path>/<train.name>, runs/quickstart for the
quickstart): config.yaml, run.json (command line, git commit, versions, host, start and end
time), metrics.jsonl, tensorboard/ (scalars, figures, HParams), figures/ (the reconstruction
figure), checkpoint_step*/ and encoder.pt; runs/leaderboard.csv and .md gain a row. Re-running
with the same --output resumes from the latest checkpoint; a finished run only re-exports.

Exit codes: 0 done, 2 bad arguments, config or input, 1 training failed.
"""
from __future__ import annotations

import sys
from pathlib import Path

from coreecg.cli import fit_job, job_parser, parse_args, resolve_config, shipped
from coreecg.train.run_speed import command_started, run_speed, speed_line


def build_parser():
    parser = job_parser(__doc__, default_config=shipped("configs/quickstart.yaml"))
    parser.add_argument("--corpus", metavar="DIR", help="the pretraining corpus (jobs/preprocess.py output); "
                                                        "default: data.corpus, else the embedded synthetic corpus")
    parser.add_argument("--output", help="the run folder (re-run to resume); "
                                         "default: <train.storage_path>/<train.name>")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    output = Path(args.output).expanduser().resolve() if args.output else None
    cfg = resolve_config(parser, args, {
        "data.corpus": ("--corpus", Path(args.corpus).expanduser().resolve() if args.corpus else None),
        "train.storage_path": ("--output", output.parent if output else None),
        "train.name": ("--output", output.name if output else None)})
    result = fit_job(cfg, "pretrain")
    if result is None:
        return 2
    run = result.run_dir
    m = result.metrics
    board = _refresh_leaderboard(run.parent)
    shown = (*cfg.method.reported_losses, "probe_auroc", "probe_auroc_init")   # the method's loss terms first
    summary = ", ".join(f"{k} {m[k]:.4f}" for k in shown if isinstance(m.get(k), float))
    print(f"\ndone: step {m.get('step')}, {summary}")
    print(speed_line(run_speed(run, command_started())))
    print(f"run folder:   {run}")
    print(f"  config:     {run / 'config.yaml'}")
    print(f"  run record: {run / 'run.json'}")
    print(f"  metrics:    {run / 'metrics.jsonl'}")
    print(f"  tensorboard: {run / 'tensorboard'}  (view: pip install tensorboard; tensorboard --logdir ...)")
    print(f"  figures:    {run / 'figures'}")
    print(f"  checkpoint: {result.checkpoint}")
    print(f"  encoder:    {result.model}  (coreecg.load_encoder reads it; jobs/export.py ships it)")
    if board:
        print(f"leaderboard:  {board}  (every pretraining run in {run.parent})")
    return 0


def _refresh_leaderboard(storage: Path) -> Path | None:
    """<storage>/leaderboard.{csv,md} over every pretraining run there; a run folder that cannot
    be read is reported, never a reason to fail a finished run."""
    from coreecg.eval.leaderboard import find_pretraining_runs, leaderboard_rows, write_leaderboard

    try:
        return write_leaderboard(leaderboard_rows(find_pretraining_runs(storage)), storage)[1]
    except Exception as e:              # noqa: BLE001 - the run itself is done and saved
        print(f"warning: leaderboard not refreshed: {type(e).__name__}: {e}", file=sys.stderr)
        return None


if __name__ == "__main__":
    sys.exit(main())
