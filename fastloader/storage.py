"""Writing files safely, and where derived files (indexes) live.

Every file fastloader writes is written to a temporary name in the same directory and renamed
into place: a reader (another rank, a resumed run) sees the old file or the complete new one,
never a partial one, even if the writer is killed or the disk fills up. Reports written where a
user names them follow what a shell redirect does to that path (:func:`write_report_bytes`); a
report at a location fastloader chose (:func:`default_report_path`, in the user's cache) is never
written through a symbolic link (:func:`write_derived_bytes`): data from strangers may ship one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO


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
    if os.access(data_path.parent, os.W_OK):
        return data_path.with_name(data_path.name + suffix)
    # Read-only data (a shared or copied dataset): an index shipped beside it may be stale for this
    # copy and could not be rebuilt there, so derived files go to the user's cache instead.
    digest = hashlib.sha1(str(data_path).encode()).hexdigest()[:16]
    return cache_dir() / f"{data_path.name}-{digest}{suffix}"


def default_report_path(source: str | os.PathLike[str], suffix: str) -> Path:
    """Where a report derived from ``source`` goes when the user named none: in :func:`cache_dir`,
    never beside or inside the source. A dataset from a stranger is a directory they chose the
    contents of: a file written there by default could be a link they planted (to a user's
    ``.bashrc``), or could be read back later as if it were the data's own."""
    text = os.fspath(source)
    real = text if "://" in text else os.path.realpath(text)  # a remote address is its own identity
    name = os.path.basename(real.rstrip("/")) or "source"
    digest = hashlib.sha1(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return cache_dir() / "reports" / f"{name}-{digest}{suffix}"


class AtomicFile:
    """A file written under a temporary name beside ``path``: :meth:`commit` fsyncs it and renames it
    into place, :meth:`abort` deletes it. Streaming writers (RecordIO, TFRecord) use it directly."""

    def __init__(self, path: str | os.PathLike[str], mode: str = "wb", encoding: str | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.file: IO[Any] = os.fdopen(fd, mode, encoding=encoding)

    def commit(self) -> None:
        if self.file.closed:
            return
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        # mkstemp makes 0600 files; datasets and indexes are shared by users and ranks.
        os.chmod(self.tmp, 0o666 & ~_umask())
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if not self.file.closed:
            self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, and rename it to ``path``."""
    target = AtomicFile(path)
    try:
        write(target.file)  # type: ignore[arg-type]
        target.commit()
    except BaseException:
        target.abort()
        raise


def _umask() -> int:
    # Read it rather than set-and-restore it: os.umask would change it for every thread meanwhile.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    atomic_write(path, lambda file: file.write(data))  # type: ignore[arg-type]


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock named after ``path``: processes building the same index take
    turns, and the later ones then find it built.

    Lock files live in :func:`cache_dir` (not beside the data, which would leave one per shard):
    they coordinate the processes of one machine; across machines the atomic rename of the index
    keeps concurrent builds correct, at worst duplicated.
    """
    digest = hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:20]
    lock_path = cache_dir() / "locks" / f"{Path(path).name[:64]}-{digest}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the regular file at ``path``; anything else (a FIFO, a device, a
    socket, a directory) is an OSError naming it, raised at once: a FIFO opened blindly waits for a
    writer forever. Opened non-blocking (no effect on a regular file), then checked: no race
    between a check and the open."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _check_regular(os.fstat(fd).st_mode, os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(path: str) -> bytes:
    """The bytes of the regular file at ``path`` (anything else raises, as :func:`open_regular`)."""
    with open(open_regular(path), "rb", buffering=0) as file:
        return file.read()


def check_regular_file(path: str) -> None:
    """Raise as :func:`read_regular_file` does unless ``path`` is a regular file (before a caller's
    own code opens it, e.g. a torchvision-style ``loader(path)``)."""
    _check_regular(os.stat(path).st_mode, path)


def _check_regular(mode: int, path: str) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "a directory, not a file to read", path)
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"not a regular file ({_file_kind(mode)}): not read", path)


def write_report_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` where a user named a report (``--report``, ``<DST>.skipped.tsv``) as a shell redirect
    would: a symbolic link is followed (its target gets the report, the link stays); a regular file,
    or a new one, is replaced atomically; a character device (``/dev/null``, a terminal) or a FIFO is
    written in place, never replaced by a regular file. A FIFO that no process reads is an error
    saying so, never a hang; a directory, a block device or a socket is refused, naming the path."""
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is None or stat.S_ISREG(mode):
        atomic_write_bytes(target, data)
        return
    if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        raise OSError(errno.EINVAL, f"not a file to write a report to ({_file_kind(mode)})", os.fspath(path))
    try:
        # No O_TRUNC (devices and FIFOs have nothing to cut), no O_CREAT; O_NONBLOCK: a FIFO without a
        # reader fails at once (ENXIO) instead of waiting for one forever.
        fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ENXIO and stat.S_ISFIFO(mode):
            raise OSError(
                error.errno, "a FIFO that no process reads: start its reader first", os.fspath(path)
            ) from None
        raise
    with os.fdopen(fd, "wb") as file:
        os.set_blocking(fd, True)  # a reader is there: write at its pace, as a shell redirect does
        file.write(data)


def write_derived_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` at a location fastloader chose (not the user): an existing symbolic link there is
    refused, naming it, never followed. The bytes go to a temporary file made with exclusive create
    (``mkstemp``: ``O_CREAT | O_EXCL``, which never opens through a link) and renamed into place; a
    rename replaces whatever sits at ``path`` (a link planted after the check included) by the new
    file, never a link's target."""
    if os.path.islink(path):
        raise FileExistsError(
            errno.EEXIST, "a symbolic link where fastloader writes a report by default: not followed", os.fspath(path)
        )
    atomic_write_bytes(path, data)


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")
