"""``fastloader pack SRC s3://bucket/prefix``: tar shards packed locally, then uploaded, the manifest last.

1. The pack runs as ``--format tar`` into a local staging directory (``$FASTLOADER_CACHE/s3-pack/...``),
   resumable after a kill like any local pack.
2. **Shards are named by their content.** Each shard is uploaded as ``<name>-<digest>.tar`` with its
   index beside it (``<that>.fl-idx``: readers then need not fetch a shard to index it). The digest
   (:func:`content_digest`, 16 hex digits of a SHA-256) covers every member's name, place and bytes, all
   a reader sees, and not the tar headers' timestamps, which differ between two packs of the same
   images. An object of that name and size already there holds that content, so it is not sent again:
   a re-pack sends exactly the shards that changed (a label fixed, an image replaced), and a killed
   upload resumes where it stopped.
3. **The manifest is the commit point, written last.** It names the shards of its own pack, so until it
   is replaced, readers see the previous pack whole (its shards are untouched: new ones have new
   names), and from the moment it is (one PUT: S3 shows a whole object or the previous one) they see
   the new pack whole. A reader never sees a manifest next to shards of another pack.
4. Then the shards the previous manifest named that the new one does not (and any earlier upload's
   left-over content-named shards) are deleted. A reader opened before the re-pack that later fetches
   one of them gets an error naming it (the dataset changed under it), never other bytes.

A first upload, with no manifest there yet, puts a marker (``fastloader-tar.progress.json``) first and
removes it after the manifest: while the marker is there without a manifest, readers refuse the prefix as
an incomplete upload. Re-packing a prefix replaces its pack (the same command after a change of the
source is the expected use); objects under the prefix that are not a pack's shards are left alone.

An LMDB is one local file that readers map into memory: it is not served from object storage. Pack
tar shards for S3 (this), or copy an LMDB to each machine's local disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from fastloader.errors import RemoteError
from fastloader.formats import json_text
from fastloader.formats.tar_manifest import MANIFEST_NAME, PROGRESS_NAME, TarPackState
from fastloader.formats.tar_shards import INDEX_SUFFIX, load_shard_index, walk_members
from fastloader.pack.local import pack_local
from fastloader.pack.summary import PackSummary
from fastloader.remote.s3 import ObjectInfo, S3Store
from fastloader.remote.url import S3Url
from fastloader.storage import cache_dir

DIGEST_CHARS = 16  # 64 bits of SHA-256: no two shards of one prefix share a name by chance
_READ_BYTES = 1 << 20


def staging_dir(url: S3Url) -> Path:
    return cache_dir() / "s3-pack" / f"{url.bucket}-{hashlib.sha1(str(url).encode()).hexdigest()[:16]}"


def content_digest(shard: str | os.PathLike[str]) -> str:
    """SHA-256 over each member's name, offset, size and bytes, in tar order (see the module docstring)."""
    digest = hashlib.sha256()
    fd = os.open(shard, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for member in walk_members(fd, os.fspath(shard)):
            digest.update(f"{len(member.name)}:{member.name}:{member.offset}:{member.size}:".encode())
            for start in range(member.offset, member.offset + member.size, _READ_BYTES):
                digest.update(os.pread(fd, min(_READ_BYTES, member.offset + member.size - start), start))
    finally:
        os.close(fd)
    return digest.hexdigest()


def content_name(name: str, digest: str) -> str:
    """``shard-000003.tar`` with content ``digest``: ``shard-000003-<16 hex>.tar``."""
    stem = name[: -len(".tar")] if name.endswith(".tar") else name
    return f"{stem}-{digest[:DIGEST_CHARS]}.tar"


def _previous_shards(url: S3Url, store: S3Store, there: Mapping[str, ObjectInfo]) -> set[str] | None:
    """The shard names of the pack published at ``url`` now (None: there is none)."""
    if url.child(MANIFEST_NAME).key not in there:
        return None
    listed = there[url.child(MANIFEST_NAME).key]  # read as listed: never more bytes than that
    raw = store.get(url.child(MANIFEST_NAME), etag=listed.etag, size=listed.size)
    try:
        return {str(shard["name"]) for shard in json_text.loads(raw, str(url.child(MANIFEST_NAME)))["shards"]}
    except (ValueError, KeyError, TypeError):
        return set()  # unreadable: nothing it names is deleted by name (content-named leftovers still are)


def _send(path: Path, target: S3Url, there: Mapping[str, ObjectInfo] | None, store: S3Store, exact_size: bool) -> bool:
    """Upload ``path`` unless its content-named object is there already (in the listing ``there``; None:
    ask the store); True when sent."""
    found = there.get(target.key) if there is not None else _stat(target, store)
    if found is not None and (not exact_size or found.size == path.stat().st_size):
        return False
    store.upload(str(path), target)
    return True


def _stat(target: S3Url, store: S3Store) -> ObjectInfo | None:
    try:
        return store.stat(target)
    except RemoteError as error:
        if error.status == 404:
            return None
        raise


class Sent(NamedTuple):
    """A shard uploaded by :func:`upload_shard`: its content name, and whether it and its index were sent."""

    name: str
    shard_sent: bool
    index_sent: bool


def upload_shard(local: Path, name: str, url: S3Url, store: S3Store, there: Mapping[str, ObjectInfo] | None) -> Sent:
    """Upload the finished shard ``local`` and its index (built beside it if missing) as shard ``name`` of the
    pack at ``url``, content-named (see the module docstring); ``there``: the prefix's listing, None to ask."""
    index = Path(load_shard_index(str(local), local.parent / f"{local.name}{INDEX_SUFFIX}").path)
    content = content_name(name, content_digest(local))
    # The index goes after its shard; an index there belongs to this content (same layout), whatever its size.
    shard_sent = _send(local, url.child(content), there, store, exact_size=True)
    index_sent = _send(index, url.child(f"{content}{INDEX_SUFFIX}"), there, store, exact_size=False)
    return Sent(content, shard_sent, index_sent)


def published(url: S3Url, store: S3Store) -> tuple[dict[str, ObjectInfo], set[str] | None]:
    """The objects directly under ``url`` by key, and the shard names of the pack published there (None: none)."""
    there = {info.key: info for info in store.list(url, recursive=False)}
    return there, _previous_shards(url, store, there)


def mark_upload(url: S3Url, store: S3Store, previous: set[str] | None, marker: bytes) -> None:
    """Before a first upload (no pack there: ``previous`` is None), the marker readers take for one under way."""
    if previous is None:
        store.put(url.child(PROGRESS_NAME), marker)


def publish(
    state: TarPackState, url: S3Url, store: S3Store, there: Mapping[str, ObjectInfo], previous: set[str] | None
) -> int:
    """Write the manifest of ``state`` (its shards uploaded, content-named), the commit point; then remove the
    marker and the shards of earlier packs in ``there`` (see the module docstring). Returns the objects deleted."""
    store.put(url.child(MANIFEST_NAME), state.to_json())  # the commit point: last
    marker = url.child(PROGRESS_NAME)
    if previous is None or marker.key in there:
        store.delete(marker)
    return _delete_stale(url, store, there, previous or set(), {shard.name for shard in state.shards}, state.prefix)


def upload_pack(directory: str | os.PathLike[str], url: S3Url, store: S3Store) -> dict[str, int]:
    """Upload a finished tar pack: changed shards and their indexes, then the manifest, then delete the
    previous pack's shards (see the module docstring). Returns what was done."""
    directory = Path(directory)
    state = TarPackState.read_manifest(directory)
    there, previous = published(url, store)
    mark_upload(url, store, previous, (directory / MANIFEST_NAME).read_bytes())  # readers: "an upload is under way"
    done = {"shards": 0, "indexes": 0, "skipped": 0, "bytes": 0, "deleted": 0}
    records = []
    for shard in state.shards:
        sent = upload_shard(directory / shard.name, shard.name, url, store, there)
        records.append(dataclasses.replace(shard, name=sent.name))
        done["shards" if sent.shard_sent else "skipped"] += 1
        done["bytes"] += (directory / shard.name).stat().st_size if sent.shard_sent else 0
        done["indexes"] += sent.index_sent
    done["deleted"] = publish(dataclasses.replace(state, shards=tuple(records)), url, store, there, previous)
    return done


def _delete_stale(
    url: S3Url, store: S3Store, there: Mapping[str, ObjectInfo], previous: set[str], current: set[str], prefix: str
) -> int:
    """Delete the shards (and indexes) of earlier packs: named by the previous manifest, or content-named."""
    ours = re.compile(rf"{re.escape(prefix)}-\d+-[0-9a-f]{{{DIGEST_CHARS}}}\.tar")
    deleted = 0
    for key in sorted(there):
        name = key.rsplit("/", 1)[-1]
        shard = name[: -len(INDEX_SUFFIX)] if name.endswith(INDEX_SUFFIX) else name
        if shard not in current and (shard in previous or ours.fullmatch(shard)):
            store.delete(S3Url(url.bucket, key))
            deleted += 1
    return deleted


def pack_to_remote(
    src: Any, dst: str, *, endpoint_url: str | None = None, keep_staging: bool = False, **options: Any
) -> PackSummary:
    """Pack ``src`` as tar shards into ``dst`` (``s3://bucket/prefix``): see the module docstring."""
    url = S3Url.parse(dst)
    output = options.get("format", "tar")
    if output == "lmdb":
        raise ValueError(
            f"{dst}: an LMDB cannot be served from object storage (readers map it from a local disk):"
            " pack --format tar for S3, or copy the LMDB to local disk"
        )
    if output != "tar":
        raise ValueError(f"{dst}: packs to S3 are tar shards (--format tar); {output!r} packs go to a local disk")
    options["format"] = "tar"
    staging = staging_dir(url)
    staging.parent.mkdir(parents=True, exist_ok=True)
    summary = pack_local(src, os.fspath(staging), **options)
    store = S3Store(endpoint_url)
    upload_pack(staging, url, store)
    report = summary.report_path
    if report is not None:  # the skipped images' list goes beside the shards
        target = url.child(Path(report).name)
        store.upload(report, target)
        report = str(target)
    if not keep_staging:
        shutil.rmtree(staging, ignore_errors=True)
    return dataclasses.replace(summary, dst=dst, report_path=report)
