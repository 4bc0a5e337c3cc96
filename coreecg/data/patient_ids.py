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

`--keep-patient-ids` (keep=True) stores the ids as read and says so in the manifest.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SALT_ENV = "COREECG_SALT_FILE"
_PREFIX = "p-"
_HEX = 24          # 96 bits: no collision among billions of patients


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


@dataclass(frozen=True)
class PatientIdPolicy:
    """How a corpus build stores patient ids of a source with identifying ids.

    keep: store them as read (`--keep-patient-ids`); salt_file: where the salt lives ("" default).
    """

    keep: bool = False
    salt_file: str = ""

    def resolve(self, output_dir: str | Path) -> tuple[dict[str, Any], bytes | None]:
        """(the manifest's and shard keys' "patient_ids" entry, the salt or None when kept).

        ValueError when the salt file would lie inside the corpus folder `output_dir`."""
        if self.keep:
            return {"stored": "as read", "keep_patient_ids": True}, None
        f = (Path(self.salt_file).expanduser() if self.salt_file else default_salt_file()).resolve()
        out = Path(output_dir).expanduser().resolve()
        if f == out or out in f.parents:
            raise ValueError(f"the patient-id salt {f} lies inside the corpus folder {out}: keep it outside "
                             "(whoever holds the corpus and the salt can test guessed ids)")
        salt = load_salt(f)
        return {"stored": "hmac-sha256 (salted, 96 bits)", "salt_id": salt_id(salt), "keep_patient_ids": False}, salt


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


__all__ = ["SALT_ENV", "default_salt_file", "load_salt", "salt_id", "pseudonym", "PatientIdPolicy", "comparable_warning"]
