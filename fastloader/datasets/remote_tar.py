"""Tar shards in S3-compatible object storage: ``TarShardDataset("s3://bucket/prefix", ...)``.

The prefix holds either a ``fastloader pack --format tar`` output (its manifest names the shards and
the classes; ``fastloader pack SRC s3://...`` also uploads each shard's index, ``<shard>.fl-idx``) or
plain WebDataset shards (every ``*.tar`` under the prefix, in key order).

* **Indexes.** Each shard's index is kept locally (``$FASTLOADER_CACHE/s3/...``). It comes from the
  ``.fl-idx`` object beside the shard when there is one (a small GET), else from the shard itself,
  fetched once into the shard cache and walked as a local shard is. An index is current while the
  object's size is unchanged. The catalog of all shards is then built as for local shards. An
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
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from fastloader.datasets.base import ProcessLocal
from fastloader.datasets.tar import CATALOG_KIND, CATALOG_VERSION, CatalogSource, write_catalog
from fastloader.errors import FormatError
from fastloader.formats.index_file import IndexFile, cached_index, read_index
from fastloader.formats.tar_manifest import MANIFEST_NAME, PROGRESS_NAME, FieldMember, TarPackState
from fastloader.formats.tar_shards import (
    IMAGE_EXTS,
    INDEX_KIND,
    INDEX_SUFFIX,
    INDEX_VERSION,
    build_shard_index,
    upgrade_index,
)
from fastloader.remote.s3 import S3Store
from fastloader.remote.shard_cache import ShardCache
from fastloader.remote.url import S3Url
from fastloader.storage import cache_dir

DEFAULT_CACHE_LIMIT = 16 << 30  # bytes of shards kept on local disk
PREFETCH_THREADS = 2  # shards fetched ahead at once, by the training process


@dataclass(frozen=True)
class _Shard:
    url: S3Url
    size: int


class _CachedShards:
    """``locate(i)``: the local file of shard ``i`` in the shard cache, fetched on a miss (picklable)."""

    def __init__(self, store: S3Store, cache: ShardCache, shards: tuple[_Shard, ...]) -> None:
        self.store, self.cache, self.shards = store, cache, shards

    def __call__(self, shard: int) -> str:
        entry = self.shards[shard]
        return self.cache.path(str(entry.url), entry.size, partial(self._fetch, entry))

    def _fetch(self, entry: _Shard, path: str) -> None:
        self.store.download(entry.url, path, entry.size)


def _mirror(url: S3Url) -> Path:
    """Local home of a prefix's indexes and catalog (the shard cache may be elsewhere)."""
    digest = hashlib.sha1(str(url).encode()).hexdigest()[:16]
    return cache_dir() / "s3" / f"{url.bucket}-{digest}"


class RemoteTarShardSource(CatalogSource):
    """A :class:`~fastloader.datasets.base.Source` over tar shards under an ``s3://`` prefix (module docstring).

    ``cache`` / ``cache_limit``: the shard cache's directory (default ``$FASTLOADER_CACHE/s3-shards``, one
    for every dataset of the machine) and its size limit in bytes. ``store``: the client (default: an
    :class:`~fastloader.remote.s3.S3Store` on ``endpoint_url`` or the environment's).
    """

    def __init__(
        self,
        url: str,
        *,
        image_exts: Sequence[str] | None = None,
        endpoint_url: str | None = None,
        cache: str | os.PathLike[str] | None = None,
        cache_limit: int = DEFAULT_CACHE_LIMIT,
        store: S3Store | None = None,
    ) -> None:
        self.url = S3Url.parse(url)
        self.image_exts = IMAGE_EXTS if image_exts is None else tuple(e.lower().lstrip(".") for e in image_exts)
        self.store = store or S3Store(endpoint_url)
        self.cache = ShardCache(cache if cache is not None else cache_dir() / "s3-shards", cache_limit)
        objects = dict(self.store.list(self.url))
        shards, self.classes, recorded = self._shard_list(objects)
        if not shards:
            raise FormatError(f"{self.url}: no tar shards there (no {MANIFEST_NAME} and no *.tar object)")
        self.shards = tuple(str(shard.url) for shard in shards)
        locate = _CachedShards(self.store, self.cache, tuple(shards))
        indexes = [self._index(shard, objects, locate, number) for number, shard in enumerate(shards)]
        self._attach(self._load_catalog(shards, indexes), locate, recorded)
        self._locate = locate
        self._prefetcher = ProcessLocal(partial(ThreadPoolExecutor, PREFETCH_THREADS, "fastloader-prefetch"))
        self._asked: deque[int] = deque(maxlen=16)  # recently asked: each window is asked for twice

    def _shard_list(self, objects: dict[str, int]) -> tuple[list[_Shard], list[str] | None, dict[str, FieldMember]]:
        manifest_key = self.url.child(MANIFEST_NAME).key
        if manifest_key not in objects and self.url.child(PROGRESS_NAME).key in objects:
            raise FormatError(
                f"{self.url}: incomplete pack upload (no {MANIFEST_NAME} yet): run the same `fastloader pack` again"
            )
        if manifest_key in objects:
            home = _mirror(self.url)
            home.mkdir(parents=True, exist_ok=True)
            local = home / MANIFEST_NAME
            local.write_bytes(self.store.get(self.url.child(MANIFEST_NAME)))
            state = TarPackState.read(local)
            if not state.complete:
                raise FormatError(f"{self.url}: incomplete pack (its manifest is not marked complete)")
            shards = []
            for record in state.shards:
                key = self.url.child(record.name).key
                if "/" in record.name or key not in objects:
                    raise FormatError(f"{self.url}/{MANIFEST_NAME}: shard {record.name!r} is missing")
                shards.append(_Shard(self.url.child(record.name), objects[key]))
            return shards, state.classes, state.fields
        keys = sorted(key for key in objects if key.endswith(".tar"))
        return [_Shard(S3Url(self.url.bucket, key), objects[key]) for key in keys], None, {}

    def _index(self, shard: _Shard, objects: dict[str, int], locate: _CachedShards, number: int) -> IndexFile:
        """The shard's index: local when current (same object size), else its .fl-idx object, else built."""
        name = shard.url.key.rsplit("/", 1)[-1]
        path = _mirror(self.url) / "index" / f"{name}{INDEX_SUFFIX}"
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
            found = upgrade_index(path, fits)  # kept here by an older fastloader
            remote_index = f"{shard.url.key}{INDEX_SUFFIX}"
            if found is None and remote_index in objects:  # uploaded by `fastloader pack ... s3://`
                path.write_bytes(self.store.get(S3Url(shard.url.bucket, remote_index)))
                found = current() or upgrade_index(path, fits)
            if found is not None:
                return found
            return build_shard_index(locate(number), path, self.image_exts)  # walks the cached shard

        return cached_index(path, current, build)

    def _load_catalog(self, shards: list[_Shard], indexes: list[IndexFile]) -> IndexFile:
        identities = [[str(shard.url), shard.size] for shard in shards]
        digest = hashlib.sha1(json.dumps([identities, list(self.image_exts)]).encode()).hexdigest()
        path = _mirror(self.url) / f"catalog-{digest[:16]}{INDEX_SUFFIX}"

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
        return {"cache_bytes": self.cache.used(), "cache_limit": self.cache.limit}
