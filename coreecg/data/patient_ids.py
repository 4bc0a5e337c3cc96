"""Patient identifiers of hospital exports: stored only as salted hashes, the salt outside the corpus.

A DICOM PatientID, a MUSE PatientID or an aECG trial subject id is a hospital's identifier (a
medical record number). A corpus built from such files (a source with `identifying_patient_ids`)
stores instead `HMAC-SHA256(salt, id)`, cut to 96 bits ("p-" and 24 hex digits):

- the same id under the same salt gives the same key, so patient-level splits and the leakage
  guard work on the keys exactly as on the ids, across every corpus built with that salt;
- without the salt the key cannot be tested against a list of candidate ids (a plain hash could:
  record numbers are few and guessable);
- the salt is a file of 32 random bytes (hex), created on first use with owner-only permissions, at
  `$COREECG_SALT_FILE`, else `~/.config/coreecg/patient-id-salt`, or where `--salt-file` says; never
  inside the corpus. The manifest records only the salt's id (a hash of it), so two corpora can be
  seen to share a salt without revealing it.

Record ids made from file and folder names (`ecg/0001.xml`, `subject12/visit_3.xml`: archives name
exports by record, accession or subject number) are identifiers too. Under the same salt they are
stored as `HMAC-SHA256(salt, "record" | id)` ("r-" and 24 hex digits; domain-separated, so a record's
key never equals a patient's), stable across rebuilds (resuming, the leakage guard and tables keyed
by record id keep matching). Reasons of quarantined records name the key, never the file; the map
from key back to id and file is written outside the corpus, owner-only (`RecordMap`), for the
data's owner. Labels tables keyed by file name still work: a reader looks labels up by the id as
read, before it is keyed.

`--keep-patient-ids` (keep=True) stores the ids and the record names as read, and says so in the
manifest; `--keep-record-ids` keeps only the record names (files named by opaque UIDs).
"""
from __future__ import annotations

import csv
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

SALT_ENV = "COREECG_SALT_FILE"
_PREFIX = "p-"
_RECORD_PREFIX = "r-"
_HEX = 24          # 96 bits: no collision among billions of patients
KEYED = "hmac-sha256 (salted, 96 bits)"


def default_salt_file() -> Path:
    """$COREECG_SALT_FILE, else ~/.config/coreecg/patient-id-salt (XDG_CONFIG_HOME respected)."""
    if os.environ.get(SALT_ENV):
        return Path(os.environ[SALT_ENV]).expanduser()
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config_home / "coreecg" / "patient-id-salt"


def load_salt(path: str | Path | None = None, create: bool = True) -> bytes:
    """The salt in `path` (default `default_salt_file()`), created there (mode 0600) when absent
    and `create`; ValueError naming the file if it is not a salt (hex digits, at least 32; created: 64)."""
    f = Path(path).expanduser() if path else default_salt_file()
    if not f.exists():
        if not create:
            raise FileNotFoundError(f"no patient-id salt at {f}")
        f.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
    text = f.read_text().strip()
    try:
        salt = bytes.fromhex(text)
    except ValueError:
        salt = b""
    if len(salt) < 16:
        raise ValueError(f"{f}: not a patient-id salt (expected at least 32 hex digits)")
    return salt


def salt_id(salt: bytes) -> str:
    """A public name of a salt (16 hex digits of its SHA-256): equal ids, equal salts."""
    return hashlib.sha256(b"coreecg-salt-id\x1f" + salt).hexdigest()[:16]


def pseudonym(salt: bytes, patient_id: str | None) -> str | None:
    """'p-' + 24 hex digits of HMAC-SHA256(salt, id); None stays None (the record is its own patient)."""
    if patient_id is None or not str(patient_id).strip():
        return None
    digest = hmac.new(salt, str(patient_id).strip().encode("utf-8"), hashlib.sha256).hexdigest()
    return _PREFIX + digest[:_HEX]


def record_key(salt: bytes, record_id: str) -> str:
    """'r-' + 24 hex digits of HMAC-SHA256(salt, "record" 0x1f id): a record id made from names."""
    digest = hmac.new(salt, b"record\x1f" + str(record_id).encode("utf-8"), hashlib.sha256).hexdigest()
    return _RECORD_PREFIX + digest[:_HEX]


def _inside(f: Path, out: Path) -> bool:
    return f == out or out in f.parents


@dataclass(frozen=True)
class Keys:
    """What a corpus build stores in place of the identifiers it reads (handed to each shard task).

    salt: None when patient ids are kept as read; key_records: record ids keyed under the salt.
    """

    salt: bytes | None = None
    key_records: bool = False

    def patient(self, patient_id: str | None) -> str | None:
        return pseudonym(self.salt, patient_id) if self.salt is not None else patient_id

    def record(self, record_id: str) -> str:
        return record_key(self.salt, record_id) if self.key_records and self.salt is not None else record_id

    def quarantine_row(self, record_id: str, paths: Sequence[str], reason: str,
                       others: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
        """A quarantine row (record_id, path: the first of `paths`, reason). When record ids are keyed
        it names no file: the key, no path, and the reason with the id, each of `paths` and each other
        record it names (`others`: (record_id, path) pairs) replaced by their keys."""
        if not self.key_records:
            return {"record_id": record_id, "path": paths[0], "reason": reason}
        key = self.record(record_id)
        names = [(key, record_id, p) for p in paths] + [(self.record(r), r, p) for r, p in others]
        return {"record_id": key, "path": "", "reason": redact(reason, names)}


def _name_forms(record_id: str, path: str = "") -> list[str]:
    """The spellings under which a record's name may appear in a message: its path (as given and
    resolved), its id with and without the file suffix, its file name."""
    forms = {record_id, str(Path(record_id).with_suffix("")) if Path(record_id).suffix else record_id}
    if path:
        forms |= {path, Path(path).name}
        try:
            forms.add(str(Path(path).resolve()))
        except OSError:
            pass
    return [f for f in forms if len(f) >= 2]


def redact(text: str, names: Iterable[tuple[str, str, str]]) -> str:
    """`text` with every whole-token spelling (`_name_forms`) of each named record replaced by its
    key: names are (key, record_id, path). Longest first, so a path goes before its file name."""
    swaps = sorted(((form, key) for key, rid, path in names for form in _name_forms(rid, path)),
                   key=lambda p: -len(p[0]))
    for form, key in swaps:
        text = re.sub(rf"(?<![\w.-]){re.escape(form)}(?![\w-])", key, text)
    return text


@dataclass(frozen=True)
class PatientIdPolicy:
    """How a corpus build stores the identifiers of a source with identifying ids: patient ids, and
    record ids made from file names.

    keep: store both as read (`--keep-patient-ids`); keep_record_ids: key patient ids only
    (`--keep-record-ids`); salt_file: where the salt lives ("" default); record_map: where the
    owner's map from record key to file goes ("" default: `default_record_map`).
    """

    keep: bool = False
    salt_file: str = ""
    keep_record_ids: bool = False
    record_map: str = ""

    def resolve(self, output_dir: str | Path) -> tuple[dict[str, Any], Keys]:
        """(the manifest's and shard keys' "patient_ids" entry, the keys to apply).

        ValueError when the salt file or the record map would lie inside the corpus folder."""
        if self.keep:
            return {"stored": "as read", "keep_patient_ids": True, "record_ids": "as read"}, Keys()
        f = (Path(self.salt_file).expanduser() if self.salt_file else default_salt_file()).resolve()
        out = Path(output_dir).expanduser().resolve()
        if _inside(f, out):
            raise ValueError(f"the patient-id salt {f} lies inside the corpus folder {out}: keep it outside "
                             "(whoever holds the corpus and the salt can test guessed ids)")
        keyed = not self.keep_record_ids
        if keyed:
            self.map_file(out)            # refused before anything is written
        salt = load_salt(f)
        return ({"stored": KEYED, "salt_id": salt_id(salt), "keep_patient_ids": False,
                 "record_ids": KEYED if keyed else "as read"}, Keys(salt, keyed))

    def map_file(self, output_dir: str | Path) -> Path:
        """Where the record map of a corpus at `output_dir` goes: `record_map`, else
        `default_record_map` beside the salt."""
        out = Path(output_dir).expanduser().resolve()
        if self.record_map:
            f = Path(self.record_map).expanduser().resolve()
        else:
            salt = Path(self.salt_file).expanduser() if self.salt_file else default_salt_file()
            f = default_record_map(salt.resolve(), out)
        if _inside(f, out):
            raise ValueError(f"the record map {f} lies inside the corpus folder {out}: it names the files behind "
                             "the keys, so it stays with the data's owner (--record-map elsewhere)")
        return f


def default_record_map(salt_file: Path, output_dir: str | Path) -> Path:
    """`<the salt's folder>/record-maps/<corpus folder name>-<8 hex of its absolute path>.csv`:
    with the salt, in the owner's private place; one file per corpus folder, rewritten by each build."""
    out = Path(output_dir).expanduser().resolve()
    tag = hashlib.sha256(str(out).encode()).hexdigest()[:8]
    return salt_file.parent / "record-maps" / f"{out.name}-{tag}.csv"


MAP_COLUMNS = ("record_key", "record_id", "path")


def write_record_map(path: Path, rows: Iterable[tuple[str, str, str]]) -> Path:
    """Write (record_key, record_id as read, file) rows to `path`, owner-only (folder 0700, file
    0600), replacing it whole; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(MAP_COLUMNS)
        w.writerows(rows)
    os.replace(tmp, path)
    return path


def read_record_map(path: str | Path) -> dict[str, dict[str, str]]:
    """A record map -> {record_key: {"record_id": ..., "path": ...}}."""
    with open(path, newline="") as f:
        return {row["record_key"]: {"record_id": row["record_id"], "path": row["path"]} for row in csv.DictReader(f)}


def comparable_warning(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    """Why the patient keys of two corpora (their manifests' "patient_ids") cannot be compared, or None.

    Keys made under different salts, or a salted key against an id as read, never match: the
    leakage guard would then find shared patients by their recordings only."""
    a, b = a or {"stored": "as read"}, b or {"stored": "as read"}
    if a.get("salt_id") == b.get("salt_id"):
        return None          # both as read, or both salted alike
    def what(x: dict[str, Any]) -> str:
        return f"salted (salt {x['salt_id']})" if x.get("salt_id") else "as read"
    return (f"patient ids are stored {what(a)} in one corpus and {what(b)} in the other: no patient can match "
            "between them, only recordings (build corpora to be compared with one --salt-file)")


__all__ = ["SALT_ENV", "KEYED", "default_salt_file", "load_salt", "salt_id", "pseudonym", "record_key", "Keys",
           "redact", "PatientIdPolicy", "default_record_map", "write_record_map", "read_record_map",
           "comparable_warning"]
