"""Map-style access to WebDataset-style tar shards: ``TarShardDataset("train-{000000..000099}.tar")``.

Each shard is indexed once (see :mod:`fastloader.formats.tar_shards`). The per-shard indexes are
then concatenated into one *catalog* for the whole shard list (``fastloader.datasets.tar_catalog``; in
the cache dir, keyed by the shard paths, rebuilt when a shard's size or mtime changes): global numpy
arrays of offsets, sizes, labels and keys, memory-mapped once per process. One catalog rather than
thousands of per-shard memory maps keeps each worker's file descriptors and page tables bounded at
10M samples; shard files are opened lazily in each process, a bounded number at a time, and read
with ``os.pread``.

Every member of a sample besides its image and label is one of its *fields* (``fastloader.fields``),
named by its extension (``txt``, ``json``, ``seg.png``; a second image of a sample, e.g. a ``png`` next
to the ``jpg`` chosen as the image, too), with the kind WebDataset's conventions give that extension.
The catalog keeps them as the shard indexes do: CSR arrays ``member_starts`` / ``member_ext`` /
``member_offset`` / ``member_size`` (extension codes into ``meta["member_exts"]``), so a field is one
``pread``. Members with a label extension (``cls``, ``cls2``, ``class``, ``label``) are never fields.

``pattern`` may also be the output directory of ``fastloader pack --format tar``; its manifest
gives the shard list, the class names and the fields' original names and kinds, and (packs of
version 3) each shard's size and SHA-256: at open, a shard whose size, or whose hash as its index
recorded it from the shard's bytes, differs from the manifest's is a FormatError naming it (see
``fastloader.formats.tar_content`` for what is checked when). The manifest's class names are checked
too, against the SHA-256 of the source's that the pack's fingerprint records (what ``verify`` checks):
names edited in the manifest would serve every label under another class's name. The shards' indexes
hold integer labels only, so the fingerprint is the one record of the names (a pack from before it was
recorded is not checked).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from fastloader.datasets.base import ImageDataset
from fastloader.datasets.remote_tar import DEFAULT_SHARD_CACHE_LIMIT, RemoteTarShardSource
from fastloader.datasets.tar_catalog import CATALOG_KIND, CATALOG_VERSION, CatalogSource, write_catalog
from fastloader.errors import FormatError
from fastloader.fields.specs import Spec
from fastloader.formats.index_file import IndexFile, cached_index, read_index
from fastloader.formats.pack_state import classes_edited
from fastloader.formats.patterns import expand_pattern
from fastloader.formats.tar_content import Expected
from fastloader.formats.tar_manifest import FieldMember, TarPackState
from fastloader.formats.tar_shards import IMAGE_EXTS, load_shard_index
from fastloader.image.pil import decode_pil
from fastloader.remote.patterns import is_remote_pattern
from fastloader.storage import cache_dir


class _ShardList(NamedTuple):
    paths: list[str]
    classes: list[str] | None
    fields: dict[str, FieldMember]
    expected: list[Expected] | None  # what a pack's manifest records of each shard's bytes


def _shard_list(pattern: str | os.PathLike[str] | list[str]) -> _ShardList:
    """The shard paths a pattern (or a pack directory) names, and the class names, fields and shard hashes a
    pack records."""
    if not isinstance(pattern, list) and os.path.isdir(pattern):
        state = TarPackState.read_manifest(pattern)
        if classes_edited(state.fingerprint, state.classes):  # labels would be served under names not theirs
            manifest = os.path.join(os.fspath(pattern), TarPackState.MANIFEST_NAME)
            raise FormatError(
                f"{manifest}: its class names ({state.classes!r}) are not those of the source packed (the pack's "
                "fingerprint records their SHA-256): edited since? Put them back, or pack again"
            )
        shards = [os.path.join(os.fspath(pattern), shard.name) for shard in state.shards]
        hashed = all(shard.size is not None and shard.sha256 is not None for shard in state.shards)
        expected = [Expected(int(s.size or 0), str(s.sha256), s.index_sha256) for s in state.shards] if hashed else None
        return _ShardList(shards, state.classes, state.fields, expected)
    return _ShardList(expand_pattern(pattern), None, {}, None)


def _catalog_path(shards: Sequence[str], image_exts: Sequence[str]) -> Path:
    identity = json.dumps([[os.path.abspath(shard) for shard in shards], list(image_exts)])
    return cache_dir() / "tar-catalogs" / f"{hashlib.sha1(identity.encode()).hexdigest()}.fl-idx"


def _shard_stats(shards: Sequence[str]) -> list[list[Any]]:
    stats = [os.stat(shard) for shard in shards]
    return [[os.path.abspath(s), st.st_size, st.st_mtime_ns] for s, st in zip(shards, stats)]


def _build_catalog(
    path: Path,
    shards: Sequence[str],
    image_exts: Sequence[str],
    index_paths: Sequence[str] | None,
    expected: Sequence[Expected] | None,
) -> None:
    indexes = [
        load_shard_index(s, index_paths[i] if index_paths else None, image_exts, expected[i] if expected else None)
        for i, s in enumerate(shards)
    ]
    # The shard states actually indexed, so that a shard changed meanwhile triggers a rebuild.
    identities = [
        [os.path.abspath(s), index.meta["shard_size"], index.meta["shard_mtime_ns"]]
        for s, index in zip(shards, indexes)
    ]
    hashes = [index.meta.get("content_sha256") for index in indexes]
    # The index digests the manifest records, each checked when its index was loaded (load_shard_index).
    vouched = [shard.index_sha256 for shard in expected] if expected else None
    write_catalog(path, indexes, identities, image_exts, {"content_sha256": hashes, "index_sha256": vouched})


def _current_catalog(path: Path, stats: list[list[Any]], expected: Sequence[Expected] | None) -> IndexFile | None:
    try:
        catalog = read_index(path, CATALOG_KIND, CATALOG_VERSION)
    except (FileNotFoundError, FormatError):
        return None
    if catalog.meta.get("shards") != stats:
        return None
    if expected is not None and catalog.meta.get("content_sha256") != [shard.sha256 for shard in expected]:
        return None  # built for other bytes, or without hashes: the shard indexes say which shard differs
    if expected is not None and catalog.meta.get("index_sha256") != [shard.index_sha256 for shard in expected]:
        return None  # built from indexes the manifest did not vouch for (by an older fastloader)
    return catalog


def load_catalog(
    shards: Sequence[str],
    image_exts: Sequence[str] = IMAGE_EXTS,
    index_paths: Sequence[str] | None = None,
    expected: Sequence[Expected] | None = None,
) -> IndexFile:
    """The catalog of ``shards``: read when every shard is unchanged, else built (once, under a lock).
    ``expected``: each shard as a pack's manifest records it (a shard that differs: a FormatError naming it)."""
    path = _catalog_path(shards, image_exts)
    stats = _shard_stats(shards)

    def build() -> IndexFile:
        _build_catalog(path, shards, image_exts, index_paths, expected)
        return read_index(path, CATALOG_KIND, CATALOG_VERSION)

    return cached_index(path, lambda: _current_catalog(path, stats, expected), build)


class TarShardSource(CatalogSource):
    """A :class:`~fastloader.datasets.base.Source` over tar shards: item i is the i-th sample with an image.

    ``pattern``: brace pattern, glob, list of paths, or a ``fastloader pack --format tar`` directory.
    ``image_exts``: extensions that count as the image, in order of preference (default
    :data:`~fastloader.formats.tar_shards.IMAGE_EXTS`). ``index_paths``: one index file per shard,
    to keep them elsewhere than beside the shards (built there when missing).
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        *,
        image_exts: Sequence[str] | None = None,
        index_paths: Sequence[str | os.PathLike[str]] | None = None,
    ) -> None:
        self.image_exts = IMAGE_EXTS if image_exts is None else tuple(e.lower().lstrip(".") for e in image_exts)
        if not self.image_exts or not all(self.image_exts):
            raise ValueError(f"image_exts must name at least one extension, got {image_exts!r}")
        listed = _shard_list(pattern)
        self.shards, self.classes = listed.paths, listed.classes
        paths = None if index_paths is None else [os.fspath(p) for p in index_paths]
        if paths is not None and len(paths) != len(self.shards):
            raise ValueError(f"index_paths has {len(paths)} entries for {len(self.shards)} shards")
        catalog = load_catalog(self.shards, self.image_exts, paths, listed.expected)
        self._attach(catalog, tuple(self.shards).__getitem__, listed.fields)


class TarShardDataset(ImageDataset[Any]):
    """``(transform(image), target_transform(label))`` for every sample of tar shards (see :class:`TarShardSource`).

    ``classes`` / ``class_to_idx`` come from the manifest of a ``fastloader pack`` directory (None
    for plain shards, whose ``.cls`` members hold bare integers).

    ``pattern`` may be an ``s3://bucket/prefix``, or an ``s3://`` brace pattern, glob or list of URLs
    (see ``fastloader.datasets.remote_tar``): shards are read through a local shard cache
    (``shard_cache``: its directory, ``shard_cache_limit``: its size in bytes) from the store at
    ``endpoint_url`` (default: the environment's ``AWS_ENDPOINT_URL``, else AWS). Read them in a
    shard-aware order: ``fastloader.samplers.ShardWindowSampler(dataset)``. Local shards refuse these
    three, and ``s3://`` shards refuse ``index_paths``, rather than ignore them.

    ``cache``: a cache of decoded images, as on every dataset (:meth:`ImageDataset.set_cache`); on
    ``s3://`` shards it is refused, naming ``shard_cache=`` (its meaning before), and ``set_cache()``
    sets the cache of decoded images there. ``fields``: every member of a sample by its extension
    (``("jpg", "txt", "json")``: tuple items; a mapping: dict items; see ``fastloader.fields``).
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        decode: Callable[[bytes, str], Any] = decode_pil,
        *,
        image_exts: Sequence[str] | None = None,
        index_paths: Sequence[str | os.PathLike[str]] | None = None,
        endpoint_url: str | None = None,
        shard_cache: str | os.PathLike[str] | None = None,
        shard_cache_limit: int | None = None,
        cache: str | os.PathLike[str] | None = None,
        fields: Sequence[Spec] | Mapping[str, Spec] | None = None,
    ) -> None:
        source: Any
        if is_remote_pattern(pattern):
            _refuse(pattern, "s3://", index_paths=index_paths)
            if cache is not None:
                raise ValueError(
                    f"TarShardDataset({pattern!r}, cache=...): the directory of the S3 shard cache is now"
                    " shard_cache= (and its size shard_cache_limit=); cache= is the cache of decoded images,"
                    " as on every dataset (set it with set_cache() on S3 shards)"
                )
            limit = DEFAULT_SHARD_CACHE_LIMIT if shard_cache_limit is None else shard_cache_limit
            source = RemoteTarShardSource(
                pattern,
                image_exts=image_exts,
                endpoint_url=endpoint_url,
                shard_cache=shard_cache,
                shard_cache_limit=limit,
            )
        else:
            _refuse(
                pattern,
                "local",
                endpoint_url=endpoint_url,
                shard_cache=shard_cache,
                shard_cache_limit=shard_cache_limit,
            )
            source = TarShardSource(pattern, image_exts=image_exts, index_paths=index_paths)
        super().__init__(source, transform, target_transform, decode, cache=cache, fields=fields)


def _refuse(pattern: Any, where: str, **options: Any) -> None:
    """Options that shards of this kind cannot use: refused, never ignored."""
    given = [name for name, value in options.items() if value is not None]
    if given:
        other = "s3:// shards" if where == "local" else "local shards"
        verb = "is" if len(given) == 1 else "are"
        raise ValueError(f"TarShardDataset({pattern!r}): {', '.join(given)} {verb} for {other}, not {where} ones")
