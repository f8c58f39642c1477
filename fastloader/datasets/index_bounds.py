"""What a persisted folder index may name: nothing outside its root, and it must watch the root.

An index file is read beside the data (``train.fastloader-index`` beside ``train/``), so a dataset
from a stranger can ship one. Its keys are joined to the root to open each image: an absolute key or
one with a ``..`` component would read a file anywhere on the machine (``pack train out`` packing a
private image), and an index that watches no directory is never stale, so the folder's real files
would never be scanned. :func:`check_bounds` finds either; the caller treats the index as unusable
and rebuilds it from the folder. A file list's keys may be absolute (the list file names them, and
the list is what the user pointed at); its index must watch that list file.

The key check is vectorised over the index's one key blob: it runs at every load in the training
process, so it must cost no per-key Python object at 10M keys.
"""

from __future__ import annotations

import os

import numpy as np

from fastloader.errors import FormatError, printable
from fastloader.formats.index_file import IndexFile, string_at

_SLASH, _DOT = ord("/"), ord(".")


def check_bounds(index: IndexFile, source: str, folder: bool) -> None:
    """Raise FormatError naming the index file (and the key) when ``index`` names a path outside the
    root ``source`` (a folder's real path), or does not watch ``source`` (a folder or a list file)."""
    blob, offsets = index.arrays["watched"], index.arrays["watched_offsets"]
    watched = [string_at(blob, offsets, i) for i in range(len(offsets) - 1)]
    if any("\x00" in path for path in watched):  # no path holds one (os.path would raise ValueError on it)
        raise FormatError(f"{index.path}: the index watches a path with a NUL byte")
    if folder:
        _check_watched_tree(index, source, watched)
        _check_keys(index)
    elif source not in watched:
        raise FormatError(f"{index.path}: the index does not watch its list file {printable(source)!r}")


def _check_watched_tree(index: IndexFile, source: str, watched: list[str]) -> None:
    # The scan watches the root first, then the directories below it, all spelled under the root.
    if not watched or os.path.realpath(watched[0]) != source:
        raise FormatError(f"{index.path}: the index does not watch its folder {printable(source)!r}")
    prefix = watched[0].rstrip("/") + "/"
    outside = next((path for path in watched[1:] if not path.startswith(prefix)), None)
    if outside is not None:
        raise FormatError(f"{index.path}: the index watches {printable(outside)!r}, outside its folder")


def _check_keys(index: IndexFile) -> None:
    keys, starts = index.arrays["keys"], index.arrays["key_offsets"]
    if len(starts) < 2:
        return
    if int(starts[0]) != 0 or int(starts[-1]) != len(keys) or bool(np.any(np.diff(starts) < 0)):
        raise FormatError(f"{index.path}: the key offsets do not cut the key blob in order")
    begins, ends = starts[:-1], starts[1:]
    nonempty = np.flatnonzero(ends > begins)
    absolute = nonempty[keys[begins[nonempty]] == _SLASH]
    if len(absolute):
        _refuse(index, int(absolute[0]), "an absolute path")
    # Every ".." in the blob; one is a path component when it starts and ends its key or meets a "/".
    dots = keys == _DOT
    pairs = np.flatnonzero(dots[:-1] & dots[1:])
    if not len(pairs):
        return
    owner = np.searchsorted(starts, pairs, side="right") - 1
    end = pairs + 2
    inside = end <= starts[owner + 1]  # both dots in the same key
    opens = (pairs == starts[owner]) | (keys[np.maximum(pairs - 1, 0)] == _SLASH)
    closes = (end == starts[owner + 1]) | (keys[np.minimum(end, len(keys) - 1)] == _SLASH)
    climbing = owner[inside & opens & closes]
    if len(climbing):
        _refuse(index, int(climbing[0]), "a '..' component")


def _refuse(index: IndexFile, number: int, what: str) -> None:
    key = string_at(index.arrays["keys"], index.arrays["key_offsets"], number)
    raise FormatError(f"{index.path}: key {number} ({printable(key)!r}) is {what}, outside the folder")
