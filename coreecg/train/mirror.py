"""A run folder mirrored to object storage through pyarrow filesystems (`train.mirror_uri`).

The run folder itself stays on a POSIX path (`train.storage_path`: local on one machine, a
shared mount on a cluster), because rank 0 appends to metrics.jsonl and checkpoints land by
rename. The mirror makes it durable beyond that path: the driver pushes the folder to
`<mirror_uri>/<train.name>/` after every epoch and when the fit ends (finished or failed), and a
run started where its folder holds no checkpoint pulls the mirror back first, so it resumes on
a fresh machine or cluster. Any URI `pyarrow.fs.FileSystem.from_uri` opens works: s3://, gs://,
hdfs://, abfs://, file:// (credentials as pyarrow reads them, e.g. AWS_* variables).

Push is incremental: a file is uploaded when the mirror lacks it, holds another size, or
holds a copy older than the local file (config.yaml rewritten at the same size on resume).
Checkpoint folders pruned locally (`train.keep_checkpoints`) are deleted from the mirror; nothing
else is ever deleted there. In a checkpoint folder the checkpoint goes up before its sha256
sidecar, so a folder cut short by a crash fails the pre-flight check on pull instead of loading
half a file.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable, Iterator

import pyarrow.fs as pafs

from coreecg.checkpoints import SIDECAR_SUFFIX, STEP_PREFIX
from coreecg.files import write_atomic

log = logging.getLogger(__name__)


class MirrorError(RuntimeError):
    pass


def _open(uri: str):
    try:
        return pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as e:          # pyarrow's errors derive from these
        raise MirrorError(f"train.mirror_uri={uri}: pyarrow cannot open it: {e}") from e


def _order(rel: str) -> tuple:
    """Upload order: a checkpoint's sidecar after the checkpoint it describes."""
    return (rel.endswith(SIDECAR_SUFFIX), rel)


class RunMirror:
    """The mirror of one run folder: `push()` and `pull()`."""

    def __init__(self, run_dir: Path, uri: str):
        self.run_dir, self.uri = Path(run_dir), f"{uri.rstrip('/')}/{Path(run_dir).name}"
        self.fs, self.base = _open(self.uri)

    def _remote(self) -> dict[str, tuple[int, float]]:
        """rel path -> (size, mtime s) of every file in the mirror ({} when it does not exist yet)."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.base, recursive=True, allow_not_found=True))
        except OSError as e:
            raise MirrorError(f"{self.uri}: cannot list the mirror: {e}") from e
        return {info.path[len(self.base):].lstrip("/"): (info.size, info.mtime.timestamp() if info.mtime else 0.0)
                for info in infos if info.type == pafs.FileType.File}

    def push(self) -> int:
        """Upload what changed; returns the number of files uploaded."""
        local = {p.relative_to(self.run_dir).as_posix(): p.stat()
                 for p in self.run_dir.rglob("*") if p.is_file() and not p.name.startswith(".")}
        remote = self._remote()

        def changed(rel: str) -> bool:     # missing, another size, or written locally since uploaded
            st, (size, mtime) = local[rel], remote.get(rel, (-1, 0.0))
            return st.st_size != size or st.st_mtime > mtime

        sent = 0
        for rel in sorted(filter(changed, local), key=_order):
            dest = f"{self.base}/{rel}"
            try:
                self.fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
                with open(self.run_dir / rel, "rb") as src, self.fs.open_output_stream(dest) as out:
                    while chunk := src.read(8 << 20):
                        out.write(chunk)
            except FileNotFoundError:       # pruned by the run meanwhile
                continue
            except OSError as e:
                raise MirrorError(f"{self.uri}: cannot upload {rel}: {e}") from e
            sent += 1
        gone = {r.split("/", 1)[0] for r in remote if r.startswith(STEP_PREFIX) and "/" in r} \
            - {r.split("/", 1)[0] for r in local if "/" in r}
        for folder in sorted(gone):
            self.fs.delete_dir(f"{self.base}/{folder}")
        return sent

    def pull(self) -> int:
        """Download the whole mirror into the run folder; returns the number of files."""
        remote = self._remote()
        for rel in sorted(remote, key=_order):
            try:
                write_atomic(self.run_dir / rel, lambda tmp: self._download(rel, tmp))
            except OSError as e:
                raise MirrorError(f"{self.uri}: cannot download {rel}: {e}") from e
        return len(remote)

    def _download(self, rel: str, dest: Path) -> None:
        with self.fs.open_input_stream(f"{self.base}/{rel}") as src, open(dest, "wb") as out:
            while chunk := src.read(8 << 20):
                out.write(chunk)


def push_quietly(mirror: "RunMirror | None") -> None:
    """A push that cannot fail the run: the run folder stays complete where it is, so a mirror
    that cannot be reached is a warning naming it, and the next push retries."""
    if mirror is None:
        return
    try:
        n = mirror.push()
        log.debug("%s: %d files pushed", mirror.uri, n)
    except (MirrorError, OSError) as e:
        log.warning("mirror not updated (%s); the run folder %s is complete, the next push retries", e,
                    mirror.run_dir)


def pull_if_missing(run_dir: Path, uri: str) -> int:
    """Before planning a run: a folder without checkpoints gets the mirror's copy (0: nothing
    to pull, or the folder already has its own)."""
    if not uri or any(Path(run_dir).glob(f"{STEP_PREFIX}*")):
        return 0
    n = RunMirror(run_dir, uri).pull()
    if n:
        log.info("%s: pulled %d files from the mirror %s/%s", run_dir, n, uri.rstrip("/"), Path(run_dir).name)
    return n


@contextlib.contextmanager
def mirrored(run_dir: Path, uri: str) -> Iterator[Callable[[], None] | None]:
    """A fit's mirror (`train.mirror_uri`: uri; "" for none): yields a push callable for every epoch
    (None without a mirror), and pushes once more when the fit ends, finished or failed."""
    mirror = RunMirror(run_dir, uri) if uri else None
    try:
        yield (lambda: push_quietly(mirror)) if mirror else None
    finally:
        push_quietly(mirror)
