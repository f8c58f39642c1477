"""A local cache of whole remote objects (shards), under a size limit, shared by every process of a machine.

The workers of every rank on one machine read through one cache directory:

* ``path(name, size, fetch)`` returns a local file with the object's bytes, fetching it on a miss.
  One process downloads a given object (a lock per object); the others wait for it, then share it.
* The cache never holds more than ``limit`` bytes, counting downloads in progress at their full size
  (a download's file is named ``<object>.<size>.part``). Room is made by removing the least recently
  opened objects first (mtime, touched on each ``path``). Removing a file another process is reading
  is safe on POSIX: its open descriptor keeps the data until closed; a later ``path`` fetches it again.
* Never a deadlock: a process waits for room only while other downloads are in flight, and those never
  wait for anything but the network; when an epoch's working set exceeds the limit, objects are simply
  evicted and fetched again later (slower, never stuck). An object larger than the whole limit is an
  error naming it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

_PART = ".part"
_LOCKS = ".locks"
_WAIT_S = 0.05


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _reserved(part_name: str) -> int:
    """The size a download reserved: ``<name>.<size>.part``."""
    try:
        return int(part_name[: -len(_PART)].rsplit(".", 1)[1])
    except (IndexError, ValueError):
        return 0


class ShardCache:
    """Whole objects on local disk under ``root``, at most ``limit`` bytes (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"cache limit must be > 0 bytes, got {limit}")
        self.root = Path(root)
        self.limit = int(limit)
        (self.root / _LOCKS).mkdir(parents=True, exist_ok=True)

    def _file(self, name: str) -> Path:
        # A flat, safe file name per object: the object's name kept readable, a hash keeps it unique.
        digest = hashlib.sha1(name.encode()).hexdigest()[:12]
        readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in name.rsplit("/", 1)[-1])[-80:]
        return self.root / f"{digest}-{readable}"

    def path(self, name: str, size: int, fetch: Callable[[str], None]) -> str:
        """A local file holding object ``name`` (``size`` bytes); ``fetch(path)`` writes it on a miss."""
        final = self._file(name)
        if self._fresh(final, size):
            return str(final)
        if size > self.limit:
            raise ValueError(
                f"{name}: {size} bytes do not fit in the shard cache's limit of {self.limit} bytes ({self.root});"
                " raise cache_limit above the largest shard"
            )
        with _locked(self.root / _LOCKS / f"{final.name}.lock"):  # one download per object
            if self._fresh(final, size):
                return str(final)
            part = final.with_name(f"{final.name}.{size}{_PART}")  # its reserved size in its name
            self._reserve(part, size)
            try:
                fetch(str(part))
                if part.stat().st_size != size:
                    raise OSError(f"{name}: fetched {part.stat().st_size} bytes, expected {size}")
                with _locked(self.root / _LOCKS / "space.lock"):  # a listing must not miss it mid-rename
                    os.replace(part, final)
            except BaseException:
                part.unlink(missing_ok=True)
                raise
        return str(final)

    def _fresh(self, path: Path, size: int) -> bool:
        try:
            if path.stat().st_size != size:
                return False
            os.utime(path)  # most recently used
            return True
        except FileNotFoundError:
            return False

    def _reserve(self, part: Path, size: int) -> None:
        """Make room for ``size`` bytes and claim it (a file of that size), never going over the limit."""
        while True:
            with _locked(self.root / _LOCKS / "space.lock"):
                entries = [e for e in self._entries() if not self._abandoned(e[2])]
                used = sum(entry[1] for entry in entries)
                for _, length, path in sorted(e for e in entries if not e[2].name.endswith(_PART)):
                    if used + size <= self.limit:
                        break
                    path.unlink(missing_ok=True)
                    used -= length
                if used + size <= self.limit:
                    part.touch()  # counted at ``size`` from now on, by every process: its name says so
                    return
            time.sleep(_WAIT_S)  # only downloads in flight fill it: they finish without waiting on us

    def _abandoned(self, path: Path) -> bool:
        """A download left by a process that died: its object's lock is free. Removed (True) if so."""
        if not path.name.endswith(_PART):
            return False
        lock = self.root / _LOCKS / f"{path.name[: -len(_PART)].rsplit('.', 1)[0]}.lock"
        try:
            with open(lock, "a+b") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # never waits: no deadlock here either
                fcntl.flock(handle, fcntl.LOCK_UN)
        except BlockingIOError:
            return False  # being downloaded now
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
