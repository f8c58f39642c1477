"""``s3://`` shard patterns, as :mod:`fastloader.formats.patterns` has them for local paths.

``s3://data/train/train-{000000..000099}.tar``, ``{a,b}`` choices, a list of URLs, and globs
(``*``, ``?``, ``[...]``, matched per ``/``-separated part as a local glob is, never across a ``/``).
Names are looked up in listings, never guessed: each parent prefix a pattern names is listed once (one
request per 1,000 objects; a glob's, from its first part with a wildcard), so each object comes with its
size and ETag, the version a dataset then pins its reads to. A name that is not there, or a glob that
matches nothing, is a FileNotFoundError naming it, as for local paths.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import TypeGuard

from fastloader.formats.patterns import expand_braces
from fastloader.remote.s3 import ObjectInfo, S3Store
from fastloader.remote.url import S3Url, is_remote


def is_remote_pattern(pattern: object) -> TypeGuard[str | Sequence[str]]:
    """True for an ``s3://`` URL, or a non-empty list of them; ValueError for a list mixing in local paths."""
    if isinstance(pattern, str):
        return is_remote(pattern)
    if not isinstance(pattern, (list, tuple)) or not pattern or not any(is_remote(item) for item in pattern):
        return False
    local = [item for item in pattern if not is_remote(item)]
    if local:
        raise ValueError(f"a shard list cannot mix s3:// URLs and local paths ({local[0]!r})")
    return True


def names_objects(url: str) -> bool:
    """Whether ``url`` is a pattern (braces or a glob) rather than one address (a prefix or an object)."""
    return expand_braces(url) != [url] or glob.has_magic(url)


class _Listings:
    """Listings of the prefixes looked at, each made once: key -> ObjectInfo, per (bucket, prefix, depth)."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        self.seen: dict[tuple[str, str, bool], dict[str, ObjectInfo]] = {}

    def of(self, prefix: S3Url, recursive: bool) -> dict[str, ObjectInfo]:
        where = (prefix.bucket, prefix.key, recursive)
        if where not in self.seen:
            self.seen[where] = {info.key: info for info in self.store.list(prefix, recursive=recursive)}
        return self.seen[where]

    def objects(self) -> dict[tuple[str, str], ObjectInfo]:
        """Every object any listing saw, by (bucket, key) (for the ``.fl-idx`` beside a shard)."""
        return {(bucket, key): info for (bucket, _, _), listing in self.seen.items() for key, info in listing.items()}


def _glob(url: S3Url, listings: _Listings) -> list[tuple[S3Url, ObjectInfo]]:
    parts = url.key.split("/")
    first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    base = S3Url(url.bucket, "/".join(parts[:first]))
    listing = listings.of(base, recursive=first < len(parts) - 1)  # a wildcard above the last part: all below
    matched = []
    for key in sorted(listing):
        names = key.split("/")
        if len(names) == len(parts) and all(fnmatchcase(n, p) for n, p in zip(names[first:], parts[first:])):
            matched.append((S3Url(url.bucket, key), listing[key]))
    return matched


def expand_remote_pattern(
    pattern: str | Sequence[str], store: S3Store
) -> tuple[list[tuple[S3Url, ObjectInfo]], dict[tuple[str, str], ObjectInfo]]:
    """The objects a pattern names, in its order (braces left to right, globs sorted), and every object the
    listings saw, by (bucket, key). FileNotFoundError naming a name that is not there."""
    items = [pattern] if isinstance(pattern, str) else list(pattern)
    listings = _Listings(store)
    found: list[tuple[S3Url, ObjectInfo]] = []
    for item in items:
        for name in expand_braces(item):
            url = S3Url.parse(name)
            if glob.has_magic(url.key):
                matched = _glob(url, listings)
                if not matched:
                    raise FileNotFoundError(f"no object matches {name!r}")
                found.extend(matched)
                continue
            info = listings.of(url.parent(), recursive=False).get(url.key)
            if info is None:
                raise FileNotFoundError(f"{name}: no such object (from pattern {item!r})")
            found.append((url, info))
    if not found:
        raise FileNotFoundError(f"pattern {pattern!r} names no object")
    return found, listings.objects()
