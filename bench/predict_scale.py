"""Inference at scale: records/s of jobs/predict.py's Ray Data path at 1 and 2 workers (and more
with --workers), in one run, on the same raw records.

    python -m bench.predict_scale                          # 400 records, the paper-size encoder
    python -m bench.predict_scale --records 800 --workers 1 2 4 --baseline
    python -m bench.predict_scale --model runs/ft-ptbxl    # a trained model instead
    python -m bench.predict_scale --quick                  # 40 records, tiny model: a smoke run

Records: real PTB-XL 500 Hz records of ../shared/ecg-data, re-written under new names (wfdb)
into a temporary folder until there are --records of them (never into the repository). Model:
--model, else a random paper-size encoder (`--set` overrides; the figures depend on its size,
not its weights). Each worker is one Ray actor with one CPU and one torch thread that reads,
preprocesses and scores its records (coreecg.inference.distributed); the driver only lists file names.
A setting's time is the job's wall-clock, starting its actors included (a few seconds: small
beside 400 paper-size records at ~0.2-0.5 s each on one core; fewer or smaller ones understate
the speed-up). The outputs of every setting are checked equal to the first's bit for bit
("equal_to_first"). On a shared machine the figures mean little: see load_average_1min.
--baseline adds the one-process path (`run_inference`, torch's default threads) for comparison.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import SHARED, TINY, config_args, emit, machine, parser, progress


def make_records(folder: Path, n: int) -> list[str]:
    """n WFDB records in `folder`, copies of the shared PTB-XL 500 Hz records -> their .hea paths."""
    import wfdb

    sources = sorted((SHARED / "ptbxl").glob("records500/*/*.hea"))
    if not sources:
        raise SystemExit(f"no PTB-XL 500 Hz records under {SHARED / 'ptbxl'}")
    out = []
    for i in range(n):
        rec = wfdb.rdrecord(str(sources[i % len(sources)].with_suffix("")), physical=False)
        wfdb.wrsamp(f"r{i:05d}", fs=rec.fs, units=rec.units, sig_name=rec.sig_name, d_signal=rec.d_signal,
                    fmt=rec.fmt, adc_gain=rec.adc_gain, baseline=rec.baseline, write_dir=str(folder))
        out.append(str(folder / f"r{i:05d}.hea"))
    return out


def make_model(folder: Path, config: str | None, overrides: list[str]) -> Path:
    """A random encoder of the config (paper size unless overridden), as pretraining writes it."""
    from coreecg.checkpoints import save_encoder
    from coreecg.config import load_config
    from coreecg.methods import CoReECG

    cfg = load_config(config, overrides=overrides)
    save_encoder(folder / "encoder.pt", CoReECG(cfg), cfg, step=0)
    return folder


def main() -> None:
    p = parser(__doc__, "40 records, the tiny test model, 1 and 2 workers")
    p.add_argument("--records", type=int, default=400)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--model", default=None, help="a model load_model reads (default: a random encoder)")
    p.add_argument("--baseline", action="store_true", help="also time the one-process path")
    config_args(p)
    args = p.parse_args()
    overrides = list(args.set)
    if args.quick:
        args.records, overrides = 40, [*TINY, "model.input_samples=1500", "data.crop_samples=1500",
                                       "encoders.coreecg.patch_size=150", *overrides]

    from coreecg.cluster import init_ray
    from coreecg.hub import load_model
    from coreecg.inference import list_inputs, run_inference
    from coreecg.inference.distributed import run_inference_ray

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "records").mkdir()
        (tmp / "model").mkdir()
        files = make_records(tmp / "records", args.records)
        loaded = load_model(args.model or make_model(tmp / "model", args.config, overrides))
        items, failures = list_inputs(files, loaded.config)
        init_ray(max(args.workers), reserve_for_data=1)
        rows, first = [], None

        def record(name: str, workers: int, result, seconds: float) -> None:
            nonlocal first
            out = result.embeddings if result.probs is None else result.probs
            same = None if first is None else out.tobytes() == first.tobytes()
            first = out if first is None else first
            rows.append({"path": name, "workers": workers, "records": len(result.record_id),
                         "windows": int(result.windows.sum()), "failed": len(result.failures),
                         "seconds": round(seconds, 2),
                         "records_per_s": round(len(result.record_id) / seconds, 2), "equal_to_first": same})
            progress(rows[-1])

        if args.baseline:
            t0 = time.perf_counter()
            record("one process", 0, run_inference(loaded, items, failures=failures), time.perf_counter() - t0)
        for w in args.workers:
            t0 = time.perf_counter()
            result = run_inference_ray(loaded, items, workers=w, failures=failures)
            record("ray data", w, result, time.perf_counter() - t0)

    by = {r["workers"]: r["records_per_s"] for r in rows if r["path"] == "ray data"}
    emit({"benchmark": "predict_scale", **machine(), "model": args.model or "random encoder",
          "overrides": overrides, "records": args.records, "runs": rows,
          "speedup_2_over_1": round(by[2] / by[1], 2) if 1 in by and 2 in by else None})


if __name__ == "__main__":
    main()
