"""Reading and windowing: a listed record read and preprocessed, or a corpus shard's stored windows
checked against the model's input, as (n_windows, leads, window_samples) in the storage dtype;
one record's failure is a Failure with the reader's or preprocessing's reason."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from coreecg.config import PreprocessConfig
from coreecg.data.corpus import SIGNAL_DTYPE, decode_signals, read_shard
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import Record, RecordError
from coreecg.inference.items import CorpusShard, Failure, InputRecord, Item


def prepare(item: InputRecord | Record, preprocess: PreprocessConfig) -> np.ndarray:
    """Read (a listed file) and preprocess one record -> (n_windows, leads, window_samples) in the
    storage dtype. Raises RecordError with the reader's or preprocessing's reason.
    """
    record = item if isinstance(item, Record) else item.source.read(item.ref)
    # Rounded to the corpus's storage dtype: the windows the weights were trained and scored on.
    return preprocess_record(record, preprocess).astype(SIGNAL_DTYPE)


# The preprocessing settings a stored window depends on: a corpus made otherwise is not the model's input.
_WINDOW_SETTINGS = ("sampling_rate", "window_s", "highpass_hz", "lowpass_hz", "filter_order", "zscore_eps",
                    "standardize")


def shard_windows(shard: CorpusShard, preprocess: PreprocessConfig) -> Iterator[tuple[str, np.ndarray]]:
    """A corpus shard -> (record_id, windows (n, len(preprocess.leads), T) float16) per record, in
    the order of the records' first windows; rows picked by lead name from the stored leads.

    Raises RecordError naming the shard when its windows are not the model's input (other
    preprocessing settings, a lead the model takes but the corpus lacks)."""
    stored = dict(shard.preprocess)
    stored.setdefault("standardize", "lead")                 # a corpus records it only when not the default
    want = preprocess.settings() | {"standardize": preprocess.standardize}
    wrong = [f"{k} {stored.get(k)} (the model's {want[k]})" for k in _WINDOW_SETTINGS if stored.get(k) != want[k]]
    if wrong:
        raise RecordError(shard.path, "corpus preprocessed otherwise than the model's input: " + ", ".join(wrong))
    missing = [x for x in preprocess.leads if x not in shard.leads]
    if missing:
        raise RecordError(shard.path, f"corpus lacks lead(s) {', '.join(missing)}")
    rows = [shard.leads.index(x) for x in preprocess.leads]
    table = read_shard(shard.path, ["record_id", "signal"])
    signal = decode_signals(table.column("signal"), shard.shape, SIGNAL_DTYPE, as_stored=True)
    groups: dict[str, list[int]] = {}
    for j, rid in enumerate(table.column("record_id").to_pylist()):
        groups.setdefault(rid, []).append(j)
    for rid, idx in groups.items():
        yield rid, signal[idx][:, rows]


def prepared_records(items: Sequence[Item], preprocess: PreprocessConfig
              ) -> Iterator[tuple[int, str, str, np.ndarray | None, Failure | None]]:
    """(item index, record_id, path, windows, None) per record, or (index, id, path, None, Failure)
    for an item that gave none, in order (reasons as the corpus pipeline's quarantine gives them).
    Every item gives records or exactly one Failure: a shard without records (coreecg never writes
    one: a damaged or foreign file) is a Failure, so one process and Ray actors list it alike."""
    for i, item in enumerate(items):
        if isinstance(item, CorpusShard):
            rid = path = item.path                # a shard that cannot be read fails as a whole
        else:
            rid, path = item.record_id, item.path if isinstance(item, Record) else item.ref.path
        try:
            if isinstance(item, CorpusShard):
                records = 0
                for record_id, windows in shard_windows(item, preprocess):
                    records += 1
                    yield i, record_id, path, windows, None
                if not records:
                    yield i, rid, path, None, Failure(rid, path, "empty shard: no records")
            else:
                yield i, rid, path, prepare(item, preprocess), None
        except RecordError as e:
            yield i, rid, path, None, Failure(rid, e.path or path, e.reason)
        except Exception as e:                  # a reader bug or an unforeseen format: still only this record
            yield i, rid, path, None, Failure(rid, path, f"unreadable ({type(e).__name__}: {e})")
