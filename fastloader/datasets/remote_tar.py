"""Tar shards in S3-compatible object storage: ``TarShardDataset("s3://bucket/prefix", ...)``.

The prefix holds either a ``fastloader pack --format tar`` output (its manifest names the shards and
the classes; ``fastloader pack SRC s3://...`` also uploads each shard's index, ``<shard>.fl-idx``) or
plain WebDataset shards (every ``*.tar`` under the prefix, in key order). Instead of a prefix, a brace
pattern, a glob or a list of URLs names the shards (``s3://data/train-{000000..000099}.tar``: see
:mod:`fastloader.remote.patterns`).

* **Identity.** A shard is its full key *and its version*, the ETag the listing gives. Its local index
  is kept under that identity (``$FASTLOADER_CACHE/s3/<bucket>/index/...``), so two shards of one name
  under two prefixes, or an object replaced by another of the same size, never share an index; the
  shard cache keeps its bytes under it too. Every read of a shard is pinned to that ETag (``If-Match``,
  and the response's ETag checked): an object replaced after this dataset indexed it is an
  :class:`~fastloader.errors.ObjectChanged` naming it, never bytes read through the old index.
* **Indexes.** A shard's index comes from the ``.fl-idx`` object beside the shard when there is one (a
  small GET), else from the shard itself, fetched once into the shard cache and walked as a local shard
  is. The catalog of all shards is then built as for local shards. An
  ``.fl-idx`` uploaded by an older fastloader (index version 1) is upgraded without fetching its shard
  (a pack's shards held nothing but images and labels then: see ``fastloader.formats.tar_shards``).
* **Fields**: as for local shards (``fastloader.datasets.tar``): every other member of a sample, by
  extension, or by the names and kinds the pack's manifest records.
* **Reads.** Samples are read from whole shards in the local shard cache
  (:class:`~fastloader.remote.shard_cache.ShardCache`, size-limited, shared by every worker and rank
  of the machine), fetched with several ranged GETs in flight on a miss, with retries
  (:mod:`fastloader.remote.retry`). Order matters: a shard-aware sampler
  (:class:`~fastloader.samplers.ShardWindowSampler`) reads a few shards at a time, so each shard is
  fetched once per epoch; a random order over all samples would fetch shards again and again.
* **Credentials and endpoint** come from the standard AWS chain (``AWS_ACCESS_KEY_ID``,
  ``AWS_ENDPOINT_URL``, ``~/.aws``), or ``endpoint_url=``; the client is made after fork in each worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from fastloader.datasets.handles import ProcessLocal
from fastloader.datasets.tar_catalog import CATALOG_KIND, CATALOG_VERSION, CatalogSource, write_catalog
from fastloader.errors import FormatError, printable
from fastloader.formats.index_file import IndexFile, cached_index, read_index
from fastloader.formats.pack_state import MAX_STATE_BYTES
from fastloader.formats.tar_index_digest import index_digest
from fastloader.formats.tar_manifest import MANIFEST_NAME, PROGRESS_NAME, FieldMember, TarPackState
from fastloader.formats.tar_shards import (
    IMAGE_EXTS,
    INDEX_KIND,
    INDEX_SUFFIX,
    INDEX_VERSION,
    build_shard_index,
    upgrade_index,
)
from fastloader.remote.patterns import expand_remote_pattern, names_objects
from fastloader.remote.s3 import ObjectInfo, S3Store
from fastloader.remote.shard_cache import ShardCache
from fastloader.remote.url import S3Url
from fastloader.storage import atomic_write_bytes, cache_dir

DEFAULT_SHARD_CACHE_LIMIT = 16 << 30  # bytes of shards kept on local disk
PREFETCH_THREADS = 2  # shards fetched ahead at once, by the training process


@dataclass(frozen=True)
class _Shard:
    url: S3Url
    size: int
    etag: str  # the version indexed: every read is pinned to it
    index_sha256: str | None = None  # the digest of its index's arrays its pack's manifest records (tar_index_digest)


class _CachedShards:
    """``locate(i)``: the local file of shard ``i`` in the shard cache, fetched on a miss (picklable)."""

    def __init__(self, store: S3Store, cache: ShardCache, shards: tuple[_Shard, ...]) -> None:
        self.store, self.cache, self.shards = store, cache, shards

    def __call__(self, shard: int) -> str:
        entry = self.shards[shard]
        return self.cache.path(str(entry.url), entry.size, partial(self._fetch, entry), entry.etag)

    def _fetch(self, entry: _Shard, path: str) -> None:
        self.store.download(entry.url, path, entry.size, etag=entry.etag)


def _home(bucket: str) -> Path:
    """Local home of a bucket's shard indexes, catalogs and manifests (the shard cache may be elsewhere)."""
    return cache_dir() / "s3" / bucket


def _identity_name(url: S3Url, etag: str) -> str:
    """A file name unique to one version of one object (its full key and ETag), its base name readable."""
    digest = hashlib.sha1(f"{url.key}\0{etag}".encode()).hexdigest()[:20]
    return f"{digest}-{url.key.rsplit('/', 1)[-1]}"


class RemoteTarShardSource(CatalogSource):
    """A :class:`~fastloader.datasets.base.Source` over tar shards under an ``s3://`` prefix (module docstring).

    ``shard_cache`` / ``shard_cache_limit``: the shard cache's directory (default
    ``$FASTLOADER_CACHE/s3-shards``, one for every dataset of the machine) and its size limit in bytes.
    ``store``: the client (default: an :class:`~fastloader.remote.s3.S3Store` on ``endpoint_url`` or the
    environment's).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        image_exts: Sequence[str] | None = None,
        endpoint_url: str | None = None,
        shard_cache: str | os.PathLike[str] | None = None,
        shard_cache_limit: int = DEFAULT_SHARD_CACHE_LIMIT,
        store: S3Store | None = None,
    ) -> None:
        self.image_exts = IMAGE_EXTS if image_exts is None else tuple(e.lower().lstrip(".") for e in image_exts)
        self.store = store or S3Store(endpoint_url)
        directory = shard_cache if shard_cache is not None else cache_dir() / "s3-shards"
        self.shard_cache = ShardCache(directory, shard_cache_limit)
        self.classes: list[str] | None = None
        recorded: dict[str, FieldMember] = {}
        if isinstance(url, str) and not names_objects(url):
            self.url: S3Url | None = S3Url.parse(url)
            shards, objects, self.classes, recorded = self._prefix_shards(self.url)
        else:  # braces, globs, a list: plain shards
            self.url = None
            named, objects = expand_remote_pattern(url, self.store)
            shards = [_Shard(where, info.size, info.etag) for where, info in named]
        self.shards = tuple(str(shard.url) for shard in shards)
        locate = _CachedShards(self.store, self.shard_cache, tuple(shards))
        indexes = [self._index(shard, objects, locate, number) for number, shard in enumerate(shards)]
        self._attach(self._load_catalog(shards, indexes), locate, recorded)
        self._locate = locate
        self._prefetcher = ProcessLocal(partial(ThreadPoolExecutor, PREFETCH_THREADS, "fastloader-prefetch"))
        self._asked: deque[int] = deque(maxlen=16)  # recently asked: each window is asked for twice

    def _prefix_shards(
        self, url: S3Url
    ) -> tuple[list[_Shard], dict[tuple[str, str], ObjectInfo], list[str] | None, dict[str, FieldMember]]:
        """The shards under a prefix (its manifest's, else every ``*.tar``), every object listed there, and
        the class names and fields a manifest records."""
        objects = self._listing(url)
        manifest_key = url.child(MANIFEST_NAME).key
        if (url.bucket, manifest_key) not in objects:
            if (url.bucket, url.child(PROGRESS_NAME).key) in objects:
                raise FormatError(
                    f"{url}: incomplete pack upload (no {MANIFEST_NAME} yet): run the same `fastloader pack` again"
                )
            keys = sorted(key for _, key in objects if key.endswith(".tar"))
            if not keys and url.key:  # perhaps the address of one shard
                objects = self._listing(url.parent(), recursive=False)
                keys = [url.key] if (url.bucket, url.key) in objects else []
            if not keys:
                raise FormatError(f"{url}: no tar shards there (no {MANIFEST_NAME} and no *.tar object)")
            return [self._shard(objects, url.bucket, key) for key in keys], objects, None, {}
        state = self._manifest(url, objects[(url.bucket, manifest_key)])
        if any((url.bucket, url.child(r.name).key) not in objects for r in state.shards):
            # A re-pack published this manifest after our listing began: its shards came before it, so they
            # are in a listing taken now.
            objects = self._listing(url)
        shards = []
        for record in state.shards:
            key = url.child(record.name).key
            if "/" in record.name or (url.bucket, key) not in objects:
                raise FormatError(f"{url}/{MANIFEST_NAME}: shard {record.name!r} is missing")
            shards.append(replace(self._shard(objects, url.bucket, key), index_sha256=record.index_sha256))
        return shards, objects, state.classes, state.fields

    def _listing(self, url: S3Url, recursive: bool = True) -> dict[tuple[str, str], ObjectInfo]:
        return {(url.bucket, info.key): info for info in self.store.list(url, recursive=recursive)}

    @staticmethod
    def _shard(objects: dict[tuple[str, str], ObjectInfo], bucket: str, key: str) -> _Shard:
        info = objects[(bucket, key)]
        return _Shard(S3Url(bucket, key), info.size, info.etag)

    def _manifest(self, url: S3Url, listed: ObjectInfo) -> TarPackState:
        if listed.size > MAX_STATE_BYTES:
            raise FormatError(
                f"{url}/{MANIFEST_NAME}: listed at {listed.size:,} bytes, more than the {MAX_STATE_BYTES:,} a"
                " pack's manifest may take: refused before reading"
            )
        home = _home(url.bucket) / "manifests"
        home.mkdir(parents=True, exist_ok=True)
        local = home / f"{hashlib.sha1(url.key.encode()).hexdigest()[:16]}-{MANIFEST_NAME}"
        # Read as listed (that version, never more bytes); written atomically: ranks may read it at once.
        atomic_write_bytes(local, self.store.get(url.child(MANIFEST_NAME), etag=listed.etag, size=listed.size))
        state = TarPackState.read(local)
        if not state.complete:
            raise FormatError(f"{url}: incomplete pack (its manifest is not marked complete)")
        return state

    def _index(
        self, shard: _Shard, objects: dict[tuple[str, str], ObjectInfo], locate: _CachedShards, number: int
    ) -> IndexFile:
        """The shard's index, kept under its identity (key and ETag): its .fl-idx object, else built."""
        path = _home(shard.url.bucket) / "index" / f"{_identity_name(shard.url, shard.etag)}{INDEX_SUFFIX}"
        path.parent.mkdir(parents=True, exist_ok=True)

        def fits(meta: Any) -> bool:
            return bool(meta.get("shard_size") == shard.size and meta.get("image_exts") == list(self.image_exts))

        def current() -> IndexFile | None:
            try:
                index = read_index(path, INDEX_KIND, INDEX_VERSION)
            except (FileNotFoundError, FormatError):
                return None
            return index if fits(index.meta) else None

        def build() -> IndexFile:
            remote_index = objects.get((shard.url.bucket, f"{shard.url.key}{INDEX_SUFFIX}"))
            if remote_index is not None:  # uploaded by `fastloader pack ... s3://`
                data = self.store.get(
                    S3Url(shard.url.bucket, remote_index.key), etag=remote_index.etag, size=remote_index.size
                )
                path.write_bytes(data)
                found = current() or upgrade_index(path, fits)
                if found is not None and self._vouched(found, shard):
                    return found
            return build_shard_index(locate(number), path, self.image_exts)  # walks the cached shard

        return cached_index(path, current, build)

    def _vouched(self, index: IndexFile, shard: _Shard) -> bool:
        """Whether an index fetched beside ``shard`` holds the arrays its pack's manifest records (tar packs of
        version 4 record their digest); else a warning: it is built from the shard instead. An index of an older
        pack, with no digest recorded, is taken on its own metadata (see docs/security.md)."""
        if shard.index_sha256 is None or list(self.image_exts) != list(IMAGE_EXTS):
            return True
        if index_digest(index.arrays, index.meta) == shard.index_sha256:
            return True
        warnings.warn(
            printable(
                f"{shard.url}{INDEX_SUFFIX}: rebuilding a shard index whose arrays are not those the pack's"
                " manifest records"
            ),
            stacklevel=2,
        )
        return False

    def _load_catalog(self, shards: list[_Shard], indexes: list[IndexFile]) -> IndexFile:
        identities = [[str(shard.url), shard.size, shard.etag] for shard in shards]
        digest = hashlib.sha1(json.dumps([identities, list(self.image_exts)]).encode()).hexdigest()
        path = _home(shards[0].url.bucket) / "catalogs" / f"catalog-{digest[:20]}{INDEX_SUFFIX}"
        path.parent.mkdir(parents=True, exist_ok=True)

        def current() -> IndexFile | None:
            try:
                catalog = read_index(path, CATALOG_KIND, CATALOG_VERSION)
            except (FileNotFoundError, FormatError):
                return None
            return catalog if catalog.meta.get("shards") == identities else None

        def build() -> IndexFile:
            write_catalog(path, indexes, identities, self.image_exts)
            return read_index(path, CATALOG_KIND, CATALOG_VERSION)

        return cached_index(path, current, build)

    def prefetch(self, shards: Sequence[int]) -> None:
        """Fetch these shards into the cache in the background (``ShardWindowSampler`` asks, a window
        ahead); the workers then find them there, or wait for the download already under way."""
        pool = self._prefetcher.get()
        for shard in shards:
            if shard not in self._asked:
                self._asked.append(shard)
                pool.submit(self._fetch_quietly, shard)

    def _fetch_quietly(self, shard: int) -> None:
        try:
            self._locate(shard)
        except Exception:  # noqa: BLE001 - a prefetch is a hint: the worker's own read raises, naming the shard
            pass

    def stats(self) -> dict[str, Any]:
        """The shard cache's bytes now and its limit."""
        return {"shard_cache_bytes": self.shard_cache.used(), "shard_cache_limit": self.shard_cache.limit}
