"""`coreecg.embed` / `coreecg.predict` on a raw array: any length, rate and lead set, under the
model's own input contract, equal to jobs/predict.py's output for the same record bit for bit.

The records: a real 36 s, 500 Hz CPSC recording cut to 8 s (one short, padded window) and to
30 s (three windows), written as WFDB files; a user reads them with wfdb and passes the array.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np
import pytest

import coreecg
from tests.helpers import tiny_models

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_models(tmp_path_factory.mktemp("embed-models"))


@pytest.fixture(scope="module")
def cuts(ecg_data, tmp_path_factory) -> dict[int, Path]:
    """{seconds: record path} for 8 s and 30 s cuts of CPSC A0011 (500 Hz, 36 s), same samples."""
    import wfdb

    out = tmp_path_factory.mktemp("embed-records")
    rec = wfdb.rdrecord(str(ecg_data / "cpsc2018-cinc2020" / "A0011"), physical=False)
    assert rec.fs == 500 and rec.sig_len >= 30 * 500
    for s in (8, 30):
        wfdb.wrsamp(f"cut{s}", fs=rec.fs, units=rec.units, sig_name=rec.sig_name, d_signal=rec.d_signal[:s * 500],
                    fmt=rec.fmt, adc_gain=rec.adc_gain, baseline=rec.baseline, write_dir=str(out))
    return {8: out / "cut8", 30: out / "cut30"}


def _job_embeddings(model: Path, files: list[Path], out: Path, monkeypatch) -> np.ndarray:
    import pyarrow.parquet as pq

    logger = logging.getLogger("coreecg")                # main() turns the console on: undone after
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    spec = importlib.util.spec_from_file_location("predict_job", REPO / "jobs" / "predict.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    argv = ["--model", str(model), "--input", *(f"{f}.hea" for f in files), "--output", str(out), "--device", "cpu"]
    assert job.main([*argv, "--embeddings"]) == 0
    return np.asarray(pq.read_table(out / "embeddings.parquet").column("embedding").to_pylist(), dtype=np.float32)


def test_embed_a_raw_500hz_record_of_8_and_30_s_as_the_job_does(models, cuts, tmp_path, monkeypatch):
    import wfdb

    from coreecg.inference import predict_paths

    job = _job_embeddings(models["encoder"], [cuts[8], cuts[30]], tmp_path, monkeypatch)
    files = [f"{cuts[s]}.hea" for s in (8, 30)]
    by_paths = predict_paths(models["classifier"], files, embeddings=True)
    assert list(by_paths.windows) == [1, 3]             # 8 s: one padded 10 s window; 30 s: three
    for row, s in enumerate((8, 30)):
        rec = wfdb.rdrecord(str(cuts[s]))              # as a user reads it: float64 mV, (samples, leads)
        x = rec.p_signal.T
        emb = coreecg.embed(x, rec.fs, rec.sig_name, model=models["encoder"])
        assert emb.shape == (32,) and emb.dtype == np.float32
        assert emb.tobytes() == job[row].tobytes()
        probs = coreecg.predict(x, rec.fs, rec.sig_name, model=models["classifier"])
        assert probs.shape == (3,) and probs.tobytes() == by_paths.probs[row].tobytes()
        # leads are taken by name: another row order gives the same numbers
        order = np.random.default_rng(s).permutation(len(rec.sig_name))
        again = coreecg.embed(x[order], rec.fs, [rec.sig_name[i] for i in order], model=models["encoder"])
        assert again.tobytes() == emb.tobytes()
    assert not np.allclose(job[0], job[1]), "both cuts embed alike: the comparison would prove nothing"


def test_embed_names_what_it_cannot_use(models, cuts):
    import wfdb

    from coreecg.hub import load_model
    from coreecg.inference import InferenceError

    rec = wfdb.rdrecord(str(cuts[8]))
    x, fs, leads = rec.p_signal.T, rec.fs, rec.sig_name
    with pytest.raises(ValueError, match=r"signal has 4000 rows for 12 lead names .*\(transpose it: rows are leads\)"):
        coreecg.embed(x.T, fs, leads, model=models["encoder"])
    with pytest.raises(InferenceError, match=r"record is 4 s, shorter than 5 s"):
        coreecg.embed(x[:, :2000], fs, leads, model=models["encoder"])
    with pytest.raises(InferenceError, match=r"missing lead\(s\) V6"):
        coreecg.embed(x[:11], fs, leads[:11], model=models["encoder"])
    with pytest.raises(InferenceError, match="is an encoder: it has no class probabilities"):
        coreecg.predict(x, fs, leads, model=models["encoder"])
    # a LoadedModel is taken as it is; a path is loaded once
    loaded = load_model(models["encoder"])
    assert (coreecg.embed(x, fs, leads, model=loaded).tobytes()
            == coreecg.embed(x, fs, leads, models["encoder"]).tobytes())


def test_a_model_exported_again_into_the_same_folder_is_not_served_from_the_cache(models, cuts, tmp_path):
    """The path cache is keyed by the folder's files too: a re-export within one process is loaded anew."""
    import wfdb

    from coreecg.hub import export_model

    rec = wfdb.rdrecord(str(cuts[8]))
    x, fs, leads = rec.p_signal.T, rec.fs, rec.sig_name
    folder = tmp_path / "export"
    export_model(models["classifier"], folder)
    assert coreecg.predict(x, fs, leads, model=folder).shape == (3,)
    other = tiny_models(tmp_path / "other", classes=("A", "B"))          # another head: 2 classes
    export_model(other["classifier"], folder)
    again = coreecg.predict(x, fs, leads, model=folder)
    assert again.shape == (2,)
    assert again.tobytes() == coreecg.predict(x, fs, leads, model=other["classifier"]).tobytes()
