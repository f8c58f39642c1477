"""A local cache of whole remote objects (shards), under a size limit, shared by every process of a machine.

The workers of every rank on one machine read through one cache directory:

* ``path(name, size, fetch, version)`` returns a local file with the object's bytes, fetching it on a
  miss. A cached file is named by the object *and its version* (its ETag): an object replaced in the
  store is a new entry, never served from the old one's file. One process downloads a given object (a
  lock per object); the others wait for it, then share it.
* The cache never holds more than ``limit`` bytes, counting downloads in progress at their full size
  (a download's file is named ``<object>.<size>.part``). Room is made by removing the least recently
  opened objects first (mtime, touched on each ``path``). Removing a file another process is reading
  is safe on POSIX: its open descriptor keeps the data until closed; a later ``path`` fetches it again.
* Never a deadlock: a process waits for room only while other downloads are in flight, and those never
  wait for anything but the network; when an epoch's working set exceeds the limit, objects are simply
  evicted and fetched again later (slower, never stuck). An object larger than the whole limit is an
  error naming it.
* A download whose process died (SIGKILL, OOM) leaves its ``.part``; its object's lock is free then, so
  any process reclaims it, and the process that takes the object's lock next removes every ``.part``
  of that object first (it alone may be downloading it).
* A failed download leaves nothing behind, its object's lock file included: a manifest naming a thousand
  missing shards must not leave a thousand lock files. The lock file is removed by the process holding
  it, and a process that waited for it and then locks a file no longer at that name (removed meanwhile)
  opens the name again, so two processes never hold "the" lock of one object at once. A lock file of an
  object fetched stays, one per cached object at most.
* Every wait is bounded: waiting for another process's download of the same object, or for room, fails
  with an error naming the object when the cache has not moved (no download grew, no file came or went)
  for ``wait_s`` seconds; a slow download that makes progress is waited for.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastloader.errors import CacheStuck

_PART = ".part"
_LOCKS = ".locks"
_POLL_S = 0.05
DEFAULT_WAIT_S = 600.0  # no progress at all for this long: a stuck download (retries give up well before)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """A short critical section (the space lock): held only for listings and renames, never while waiting."""
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _try_lock(handle: Any) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _names(handle: Any, path: Path) -> bool:
    """Whether ``path`` is still the file open as ``handle`` (not removed, nor replaced by a new one)."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino)


def _part_of(path: Path, final: Path) -> bool:
    """Whether ``path`` is a download (``<final>.<size>.part``) of the object whose cache file is ``final``."""
    return path.name.startswith(f"{final.name}.") and path.name.endswith(_PART)


def _reserved(part_name: str) -> int:
    """The size a download reserved: ``<name>.<size>.part``."""
    try:
        return int(part_name[: -len(_PART)].rsplit(".", 1)[1])
    except (IndexError, ValueError):
        return 0


class ShardCache:
    """Whole objects on local disk under ``root``, at most ``limit`` bytes (see the module docstring).

    ``wait_s``: how long a wait may see no progress before it fails (:class:`~fastloader.errors.CacheStuck`)."""

    def __init__(self, root: str | os.PathLike[str], limit: int, *, wait_s: float = DEFAULT_WAIT_S) -> None:
        if limit <= 0:
            raise ValueError(f"cache limit must be > 0 bytes, got {limit}")
        self.root = Path(root)
        self.limit = int(limit)
        self.wait_s = float(wait_s)
        (self.root / _LOCKS).mkdir(parents=True, exist_ok=True)

    def _file(self, name: str, version: str) -> Path:
        # A flat, safe file name per object version: the object's name kept readable, a hash keeps it unique.
        digest = hashlib.sha1(f"{name}\0{version}".encode()).hexdigest()[:16]
        readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in name.rsplit("/", 1)[-1])[-80:]
        return self.root / f"{digest}-{readable}"

    def path(self, name: str, size: int, fetch: Callable[[str], None], version: str = "") -> str:
        """A local file holding object ``name`` (``size`` bytes) at ``version`` (its ETag); ``fetch(path)``
        writes it on a miss."""
        final = self._file(name, version)
        if self._fresh(final, size):
            return str(final)
        if size > self.limit:
            raise ValueError(
                f"{name}: {size} bytes do not fit in the shard cache's limit of {self.limit} bytes ({self.root});"
                " raise cache_limit above the largest shard"
            )
        with self._object_lock(final, name) as lock:  # one download per object
            if self._fresh(final, size):
                return str(final)
            part = final.with_name(f"{final.name}.{size}{_PART}")  # its reserved size in its name
            self._reserve(final, part, size, name)
            try:
                fetch(str(part))
                if part.stat().st_size != size:
                    raise OSError(f"{name}: fetched {part.stat().st_size} bytes, expected {size}")
                with _locked(self.root / _LOCKS / "space.lock"):  # a listing must not miss it mid-rename
                    os.replace(part, final)
            except BaseException:
                part.unlink(missing_ok=True)
                lock.unlink(missing_ok=True)  # held: a waiter finds it gone and opens the name again
                raise
        return str(final)

    @contextlib.contextmanager
    def _object_lock(self, final: Path, name: str) -> Iterator[Path]:
        """The object's lock, its file's path given to the holder (who may remove it, see the module
        docstring): waited for while the download holding it makes progress (its .part grows)."""
        stuck = (
            f"{name}: another process has been downloading it into the shard cache ({self.root}) with no"
            f" progress for {self.wait_s:.0f} s; stop that process if it hangs, or use another cache"
        )
        path = self.root / _LOCKS / f"{final.name}.lock"
        handles: list[Any] = []

        def locked() -> bool:
            if not handles:
                handles.append(open(path, "a+b"))  # noqa: SIM115 - closed below, whatever happens
            if not _try_lock(handles[0]):
                return False
            if _names(handles[0], path):
                return True
            handles.pop().close()  # removed by the process that held it: the name's current file is the lock
            return False

        try:
            self._wait(locked, lambda: self._progress(final), stuck)
            yield path
        finally:
            for handle in handles:
                handle.close()  # closing releases the lock

    def _wait(self, ready: Callable[[], bool], progress: Callable[[], object], stuck: str) -> None:
        """Poll ``ready()`` until true; CacheStuck when ``progress()`` stays the same for ``wait_s``."""
        last: object = ()
        since = time.monotonic()
        while not ready():
            try:
                now = progress()
            except FileNotFoundError:  # a file went while we looked: that is progress
                now = None
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > self.wait_s:
                raise CacheStuck(stuck)
            time.sleep(_POLL_S)

    def _fresh(self, path: Path, size: int) -> bool:
        try:
            if path.stat().st_size != size:
                return False
            os.utime(path)  # most recently used
            return True
        except FileNotFoundError:
            return False

    def _reserve(self, final: Path, part: Path, size: int, name: str) -> None:
        """Make room for ``size`` bytes and claim it (a file of that size), never going over the limit.

        Called holding the object's lock: a ``.part`` of this object is then a dead process's, whatever its
        size, and goes first (counted, it would wait for room only its own download could free)."""

        def claimed() -> bool:
            with _locked(self.root / _LOCKS / "space.lock"):
                entries = []
                for entry in self._entries():
                    if _part_of(entry[2], final):
                        entry[2].unlink(missing_ok=True)
                    elif not self._abandoned(entry[2]):
                        entries.append(entry)
                used = sum(entry[1] for entry in entries)
                for _, length, path in sorted(e for e in entries if not e[2].name.endswith(_PART)):
                    if used + size <= self.limit:
                        break
                    path.unlink(missing_ok=True)
                    used -= length
                if used + size > self.limit:
                    return False  # only downloads in flight fill it: they finish without waiting on us
                part.touch()  # counted at ``size`` from now on, by every process: its name says so
                return True

        stuck = (
            f"{name}: no room for its {size} bytes in the shard cache ({self.root}, limit {self.limit} bytes):"
            f" other downloads held it with no progress for {self.wait_s:.0f} s; raise cache_limit (a shard"
            " window needs about window x the largest shard) or stop the process that hangs"
        )

        self._wait(claimed, lambda: self._progress(None), stuck)

    def _progress(self, final: Path | None) -> dict[str, int]:
        """What moves while downloads progress: the files (of ``final``'s downloads only, when given) and
        their sizes. Not mtimes: readers touch cached files on every hit."""
        with os.scandir(self.root) as found:
            return {
                e.name: e.stat().st_size
                for e in found
                if e.is_file() and not e.name.startswith(".") and (final is None or _part_of(Path(e.path), final))
            }

    def _abandoned(self, path: Path) -> bool:
        """A download left by a process that died: its object's lock is free. Removed (True) if so."""
        if not path.name.endswith(_PART):
            return False
        lock = self.root / _LOCKS / f"{path.name[: -len(_PART)].rsplit('.', 1)[0]}.lock"
        try:
            with open(lock, "rb") as handle:  # never created here: no lock file is left by a look
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # never waits: no deadlock here either
                fcntl.flock(handle, fcntl.LOCK_UN)
        except BlockingIOError:
            return False  # being downloaded now
        except FileNotFoundError:
            pass  # its downloader removed it (a failed download), or never was: no one downloads it
        path.unlink(missing_ok=True)
        return True

    def _entries(self) -> list[tuple[float, int, Path]]:
        entries, inodes = [], set()
        with os.scandir(self.root) as found:
            for entry in found:
                if entry.is_file() and not entry.name.startswith("."):
                    try:
                        stat = entry.stat()
                    except FileNotFoundError:
                        continue
                    if stat.st_ino in inodes:  # renamed (.part -> final) while listing: seen twice
                        continue
                    inodes.add(stat.st_ino)
                    size = stat.st_size
                    if entry.name.endswith(_PART):  # a download counts its whole size from the start
                        size = max(size, _reserved(entry.name))
                    entries.append((stat.st_mtime, size, Path(entry.path)))
        return entries

    def used(self) -> int:
        """Bytes held now, downloads in progress included (under the lock: a listing taken while files
        come and go would count some twice)."""
        with _locked(self.root / _LOCKS / "space.lock"):
            return sum(entry[1] for entry in self._entries())
