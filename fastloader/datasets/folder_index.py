"""The persisted index of an image folder tree or a file list: built once, memory-mapped ever after.

Scanning 10M files takes minutes locally and tens of minutes on a network filesystem, and a list of
10M ``(path, label)`` tuples costs GBs in every worker. So a scan (or a list file's parse) is turned
into numpy arrays (keys as one UTF-8 blob plus int64 offsets, int64 labels), written once with
:func:`~fastloader.formats.index_file.write_index`, and from then on loaded by every run and every rank as
an ``mmap``: no per-entry work, no per-entry Python objects.

Where the index lives: ``index_path`` when given, else :func:`~fastloader.storage.sidecar_path` of
the folder (``/data/train`` -> ``/data/train.fastloader-index``, a file *beside* the folder so the
tree itself is never written to) or of the list file; when that directory is read-only, in
:func:`~fastloader.storage.cache_dir` under a name keyed by the resolved absolute path.

When it is rebuilt (under :func:`~fastloader.storage.file_lock`, so concurrent ranks build once and
the others reuse the result):

* it is missing, unreadable, of another format version, or built for another root or list file;
* it names a path outside its root (an absolute key or a ``..`` component), or does not watch its
  root or list file (:mod:`~fastloader.datasets.index_bounds`): a dataset from a stranger may ship
  its own index, and such an index would read files elsewhere on the machine, or never go stale;
* the settings that decide its content differ (the extensions, or the ``is_valid_file`` filter);
* a *watched path* changed: every directory of the tree (the root, each class directory and each
  sub-directory, with its ``mtime_ns``), or the list file. Adding, removing or renaming a file
  changes its directory's mtime, so the directories (typically a few thousand) stand for the 10M
  files, and checking them is a parallel ``stat`` of each;
* it was built less than ``RACY_NS`` after a watched path last changed: filesystem timestamps are
  coarse (a clock tick, or worse on network filesystems), so a change in the same tick as the scan
  could leave the mtime unchanged. Such an index serves the construction that built it and is
  rebuilt at the next load (real data is written long before training, so this is rare).

Not detected: a file's content edited in place (its directory's mtime does not change); pass
``rebuild=True`` after doing that. A custom ``is_valid_file`` is recognised by its qualified name and
a digest of its bytecode; change what it accepts in a helper it calls and you need ``rebuild=True``
too. Lambdas, local functions and ``functools.partial`` objects cannot be named reliably, so with
those the tree is scanned at every construction (the index is still written, for the workers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from fastloader.datasets.index_bounds import check_bounds
from fastloader.errors import FormatError, printable
from fastloader.formats.index_file import IndexFile, pack_strings, read_index, require_array, string_at, write_index
from fastloader.storage import file_lock, sidecar_path

log = logging.getLogger(__name__)

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's
INDEX_SUFFIX = ".fastloader-index"
FOLDER_KIND, LIST_KIND = "folder", "filelist"
FORMAT_VERSION = 1
# A file list's content depends on nothing but the file. Format 2 added the text columns of a
# .csv/.tsv: an index of format 1 is rebuilt (through its settings, so image-folder indexes, whose
# layout did not change, are not rescanned).
LIST_SETTINGS = "list-format:2"
RESERVED_COLUMNS = ("image", "label")  # a column of these names cannot be a field: they mean the image and label
RACY_NS = 2_000_000_000  # timestamps closer than this to the scan are not trusted (coarse clocks)
_NOT_REGULAR = (stat.S_ISFIFO, stat.S_ISCHR, stat.S_ISBLK, stat.S_ISSOCK)  # never opened: a FIFO would hang
_NOT_REGULAR_EXAMPLES = 10  # FIFOs, devices and sockets named in the log and the index


@dataclass(frozen=True)
class IndexMeta:
    """What an index was built from; stored as the index file's JSON ``meta``."""

    source: str  # the real path of the folder root or list file
    settings: str | None  # what else decides the content; None: cannot be compared, never reused
    classes: tuple[str, ...]
    scanned_at_ns: int  # wall clock when the scan started
    samples_digest: str  # content_id(): workers check they reopened an index listing the same samples
    fields: tuple[str, ...] = ()  # a file list's text columns: arrays field<j> and field<j>_offsets
    label_column: str | None = None  # the header's name of a file list's label column
    not_regular: int = 0  # entries of a folder skipped as FIFOs, devices or sockets (never opened)
    not_regular_examples: tuple[str, ...] = ()  # the first few of them, as keys

    @classmethod
    def of(cls, index: IndexFile) -> IndexMeta:
        try:
            meta = dict(index.meta)
            tuples = {name: tuple(meta.get(name, ())) for name in ("classes", "fields", "not_regular_examples")}
            found = cls(**{**meta, **tuples})
        except (TypeError, KeyError) as error:
            raise FormatError(f"{index.path}: malformed index metadata ({error})") from error
        if not found.well_typed():
            raise FormatError(f"{index.path}: malformed index metadata (a value of the wrong type)")
        return found

    def well_typed(self) -> bool:
        """Every value of the type it is declared with (read back from a file, any of them may lie)."""
        names = (*self.classes, *self.fields, *self.not_regular_examples, self.source, self.samples_digest)
        counts = (self.scanned_at_ns, self.not_regular)
        optional = (self.settings, self.label_column)
        return (
            all(isinstance(name, str) for name in names)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in counts)
            and all(value is None or isinstance(value, str) for value in optional)
        )


@dataclass(frozen=True)
class ClassScan:
    """One class directory's scan: its accepted files' keys and the directories it watched."""

    keys: bytes  # UTF-8 keys (paths relative to the root), concatenated
    key_lengths: np.ndarray  # int64, bytes per key
    dirs: list[str]  # absolute paths of the directories walked
    dir_mtime_ns: list[int]
    not_regular: list[str] = dataclasses.field(default_factory=list)  # keys of FIFOs, devices, sockets skipped


def filter_settings(is_valid_file: Callable[[str], bool] | None) -> str | None:
    """A string naming what decides which files are accepted; None when it cannot be named reliably."""
    if is_valid_file is None:
        return "extensions:" + ",".join(IMG_EXTENSIONS)
    module = getattr(is_valid_file, "__module__", None)
    qualname = getattr(is_valid_file, "__qualname__", None)
    if not module or not qualname or "<" in qualname:  # a lambda or a local function
        return None
    code = getattr(is_valid_file, "__code__", None)
    digest = hashlib.sha1(code.co_code).hexdigest()[:16] if code is not None else ""
    return f"is_valid_file:{module}.{qualname}:{digest}"


def default_index_path(data_path: str) -> str:
    """Beside the data when its directory is writable, else in the cache directory."""
    return os.fspath(sidecar_path(data_path, INDEX_SUFFIX))


# --- loading, checking and building under a lock -------------------------------------------------


def load_or_build(
    index_path: str,
    kind: str,
    identity: tuple[str, str | None],
    build: Callable[[], tuple[IndexMeta, dict[str, np.ndarray]]],
    rebuild: bool = False,
    stat_workers: int | None = None,
) -> IndexFile:
    """The index at ``index_path`` when it was built from ``identity`` (source, settings) and is
    current; else ``build()`` it, write it and return it memory-mapped."""
    started = time.time_ns()
    reason: str | None = "rebuild=True"
    if not rebuild:
        index = _read_or_none(index_path, kind)
        reason = _stale_reason(index, identity, stat_workers)
        if reason is None and index is not None:
            return index
    with file_lock(index_path):
        index = _read_or_none(index_path, kind)
        if index is not None and _matches(index, identity):
            # Another rank may have built it while we waited for the lock: a scan that started
            # after we did is as fresh as one we would make now.
            if IndexMeta.of(index).scanned_at_ns >= started:
                return index
            if not rebuild and _stale_reason(index, identity, stat_workers) is None:
                return index
        log.info("%s: indexing %s (%s)", index_path, identity[0], reason)
        meta, arrays = build()
        write_index(index_path, kind, FORMAT_VERSION, dataclasses.asdict(meta), arrays)
        return read_index(index_path, kind, FORMAT_VERSION)


def _read_or_none(index_path: str, kind: str) -> IndexFile | None:
    try:
        index = read_index(index_path, kind, FORMAT_VERSION)
        check_lengths(index)
    except FileNotFoundError:
        return None
    except FormatError as error:
        log.info("rebuilding an unusable index: %s", printable(str(error)))
        return None
    try:
        check_bounds(index, IndexMeta.of(index).source, kind == FOLDER_KIND)
    except FormatError as error:
        # Not wear and tear: an index that reads outside its root was written to (or shipped with the data).
        log.warning("rebuilding an index that names files outside its root: %s", error)
        return None
    return index


def check_lengths(index: IndexFile) -> None:
    """The arrays are as long as each other and the meta say (a lying index must not be indexed past
    an array's end; the values within are only sliced, which cannot fail). Cheap: no per-sample array
    is scanned."""
    meta = IndexMeta.of(index)
    count = len(require_array(index, "key_offsets", np.int64)) - 1
    require_array(index, "keys", np.uint8)
    require_array(index, "labels", np.int64, max(count, 0))
    watched = len(require_array(index, "watched_mtime_ns", np.int64))
    require_array(index, "watched", np.uint8)
    require_array(index, "watched_offsets", np.int64, watched + 1)
    if index.kind == FOLDER_KIND:
        counts = require_array(index, "class_counts", np.int64, len(meta.classes)).tolist()  # one per class
        if min(counts, default=0) < 0 or sum(counts) != count:
            raise FormatError(f"{index.path}: the class counts do not add up to the {count} samples")
    else:
        require_array(index, "label_range", np.int64, 2)
    for number in range(len(meta.fields)):
        require_array(index, f"field{number}", np.uint8)
        require_array(index, f"field{number}_offsets", np.int64, count + 1)


def _matches(index: IndexFile, identity: tuple[str, str | None]) -> bool:
    try:
        meta = IndexMeta.of(index)
    except FormatError:
        return False
    return identity[1] is not None and (meta.source, meta.settings) == identity


def _stale_reason(index: IndexFile | None, identity: tuple[str, str | None], stat_workers: int | None) -> str | None:
    """Why ``index`` cannot be used (None: it can)."""
    if index is None:
        return "missing"
    if not _matches(index, identity):
        return "built for another source or other settings"
    mtimes = index.arrays["watched_mtime_ns"]
    if len(mtimes) and int(mtimes.max()) >= IndexMeta.of(index).scanned_at_ns - RACY_NS:
        return "built within seconds of a change"
    blob, offsets = index.arrays["watched"], index.arrays["watched_offsets"]
    paths = [string_at(blob, offsets, i) for i in range(len(mtimes))]
    with ThreadPoolExecutor(stat_workers) as pool:
        now = list(pool.map(_mtime_ns_or_none, paths))
    for path, before, after in zip(paths, mtimes.tolist(), now):
        if after != before:
            return f"{path} changed"
    return None


def _mtime_ns_or_none(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except (OSError, ValueError):  # ValueError: a NUL byte in a path read back from a corrupt index
        return None


# --- scanning a folder tree ----------------------------------------------------------------------


def find_classes(root: str) -> list[str]:
    """The class names: sorted sub-directory names of ``root`` (symlinks followed), as torchvision."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
    return classes


def scan_folder(
    root: str, is_valid_file: Callable[[str], bool] | None, settings: str | None, workers: int | None
) -> tuple[IndexMeta, dict[str, np.ndarray]]:
    """Scan the tree under ``root`` (class directories in parallel threads) into index arrays.

    ``root`` is the path as the user gave it (user-expanded): ``is_valid_file`` sees the same path
    strings as under torchvision.
    """
    from tqdm import tqdm

    started = time.time_ns()
    root_stat = os.stat(root)  # before listing: a change during the scan shows
    classes = find_classes(root)
    root_identity = ((root_stat.st_dev, root_stat.st_ino),)
    with ThreadPoolExecutor(workers) as pool:
        jobs = pool.map(lambda name: scan_class(root, name, is_valid_file, root_identity), classes)
        scans = list(tqdm(jobs, total=len(classes), desc=f"indexing {root}", unit="class", disable=None))
    arrays = assemble_folder_arrays(os.path.abspath(root), root_stat.st_mtime_ns, scans)
    odd = [key for scan in scans for key in scan.not_regular]
    if odd:
        log.warning(
            "%s: skipped %d %s not regular files (FIFOs, devices or sockets; never opened): %s",
            root,
            len(odd),
            "entry that is" if len(odd) == 1 else "entries that are",
            ", ".join(map(printable, odd[:_NOT_REGULAR_EXAMPLES]))
            + (", ..." if len(odd) > _NOT_REGULAR_EXAMPLES else ""),
        )
    meta = IndexMeta(
        os.path.realpath(root),
        settings,
        tuple(classes),
        started,
        content_id(arrays),
        not_regular=len(odd),
        not_regular_examples=tuple(odd[:_NOT_REGULAR_EXAMPLES]),
    )
    return meta, arrays


def scan_class(
    root: str,
    name: str,
    is_valid_file: Callable[[str], bool] | None,
    outer: tuple[tuple[int, int], ...] = (),
) -> ClassScan:
    """The files of one class directory in torchvision's order: directories sorted by path, files
    sorted by name within each, as ``sorted(os.walk(top, followlinks=True))`` yields them.

    ``outer``: (st_dev, st_ino) of directories above the class (the root): like the class's own
    ancestors, a symlink back to one of them is not followed.
    """
    top = os.path.join(root, name)
    listed: list[tuple[str, list[str]]] = []  # (path suffix below top, file names)
    not_regular: list[str] = []
    dirs: list[str] = []
    mtimes: list[int] = []
    pending: list[tuple[str, tuple[tuple[int, int], ...]]] = [("", outer)] if os.path.isdir(top) else []
    while pending:
        suffix, ancestors = pending.pop()
        try:
            stat = os.stat(top + suffix)
        except OSError:
            continue  # vanished since its parent was listed
        identity = (stat.st_dev, stat.st_ino)
        if identity in ancestors:
            continue  # a symlink to an ancestor: os.walk would descend until ELOOP; we stop at once
        dirs.append(os.path.abspath(top + suffix))
        mtimes.append(stat.st_mtime_ns)
        listing = _list_directory(top + suffix)
        if listing is not None:
            subdirs, files, odd = listing
            listed.append((suffix, files))
            not_regular.extend(f"{name}{suffix}/{entry}" for entry in sorted(odd))
            pending.extend((f"{suffix}/{sub}", (*ancestors, identity)) for sub in subdirs)
    listed.sort(key=lambda item: item[0])
    keys = []
    for suffix, files in listed:
        for file in sorted(files):
            if is_valid_file is None:
                accepted = file.lower().endswith(IMG_EXTENSIONS)
            else:
                accepted = is_valid_file(f"{top}{suffix}/{file}")
            if accepted:
                keys.append(f"{name}{suffix}/{file}".encode("utf-8", "surrogateescape"))
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    return ClassScan(b"".join(keys), lengths, dirs, mtimes, sorted(not_regular))


def _list_directory(path: str) -> tuple[list[str], list[str], list[str]] | None:
    """(sub-directories, files, FIFOs / devices / sockets) of ``path``; None where os.walk would skip
    the directory (unreadable). os.walk lists the third kind among the files, but opening a FIFO
    waits for a writer forever: they are kept apart, and never opened."""
    subdirs: list[str] = []
    files: list[str] = []
    odd: list[str] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                (subdirs if _is_dir(entry) else files if _is_file(entry) else odd).append(entry.name)
    except OSError:
        return None
    return subdirs, files, odd


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows symlinks, as os.walk(followlinks=True)
    except OSError:
        return False


def _is_file(entry: os.DirEntry[str]) -> bool:
    """Not a FIFO, a device or a socket (symlinks followed; a plain regular file costs no stat)."""
    try:
        if entry.is_file():
            return True
        mode = entry.stat().st_mode
    except OSError:
        return True  # a dangling symlink, an entry that cannot be stat'ed: listed as os.walk does (its read names it)
    return not any(test(mode) for test in _NOT_REGULAR)


def assemble_folder_arrays(root: str, root_mtime_ns: int, scans: Sequence[ClassScan]) -> dict[str, np.ndarray]:
    """The index arrays from per-class scans (label = position in ``scans``)."""
    counts = np.array([len(scan.key_lengths) for scan in scans], dtype=np.int64)
    key_offsets = np.zeros(int(counts.sum()) + 1, dtype=np.int64)
    if len(scans):
        np.cumsum(np.concatenate([scan.key_lengths for scan in scans]), out=key_offsets[1:])
    watched, watched_offsets = pack_strings([root, *(d for scan in scans for d in scan.dirs)])
    return {
        "keys": np.frombuffer(b"".join(scan.keys for scan in scans), dtype=np.uint8),
        "key_offsets": key_offsets,
        "labels": np.repeat(np.arange(len(scans), dtype=np.int64), counts),
        "class_counts": counts,
        "watched": watched,
        "watched_offsets": watched_offsets,
        "watched_mtime_ns": np.array([root_mtime_ns, *(m for scan in scans for m in scan.dir_mtime_ns)], np.int64),
    }


# --- parsing a file list -------------------------------------------------------------------------


def content_id(arrays: dict[str, np.ndarray]) -> str:
    """A digest of the samples an index lists (paths, labels and a file list's text columns, in order).

    Workers compare it with their parent's: a rebuild that lists the same samples (another rank's,
    or one forced by coarse timestamps) is harmless, one that lists others is an error.
    """
    digest = hashlib.blake2b(digest_size=16)
    columns = sorted(name for name in arrays if name.startswith("field"))
    for name in ("keys", "key_offsets", "labels", *columns):
        digest.update(np.ascontiguousarray(arrays[name]).data)
    return digest.hexdigest()
