"""Writing files safely, and where derived files (indexes) live.

Every file fastloader writes is written to a temporary name in the same directory and renamed
into place: a reader (another rank, a resumed run) sees the old file or the complete new one,
never a partial one, even if the writer is killed or the disk fills up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def cache_dir() -> Path:
    """``$FASTLOADER_CACHE``, else ``$XDG_CACHE_HOME/fastloader``, else ``~/.cache/fastloader``."""
    explicit = os.environ.get("FASTLOADER_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "fastloader" if xdg else Path.home() / ".cache" / "fastloader"


def sidecar_path(data_path: str | os.PathLike[str], suffix: str) -> Path:
    """Where to keep a file derived from ``data_path``: beside it when that directory is writable
    (shared by every rank and machine that sees the data), else in :func:`cache_dir`."""
    data_path = Path(data_path).resolve()
    beside = data_path.with_name(data_path.name + suffix)
    if beside.exists() or os.access(data_path.parent, os.W_OK):
        return beside
    digest = hashlib.sha1(str(data_path).encode()).hexdigest()[:16]
    return cache_dir() / f"{data_path.name}-{digest}{suffix}"


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, and rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    atomic_write(path, lambda file: file.write(data))  # type: ignore[arg-type]


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock on ``path + '.lock'``: ranks building the same index take turns,
    and the others then find it built."""
    lock_path = Path(str(path) + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
