"""``verify`` of a tar pack's shard indexes: each one's arrays against a scan of its shard's members.

An index (``<shard>.fl-idx``) steers every read of its shard, and its meta naming the shard's size and
SHA-256 says nothing of its arrays: flipped labels or swapped offsets would be served as they are. So
every index a reader of the pack would use is compared with the arrays the scan of its shard gives
(the code that indexes a shard, :func:`~fastloader.formats.tar_shards.scan_shard`), the first sample
that differs named, and with the digest the manifest records of it (``index_sha256``, tar packs of
version 4), which a reader checks at open. A pack written before those digests is checked the same
way, but the report says a reader cannot check its indexes when it opens it (it is not OK).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fastloader.errors import FormatError
from fastloader.formats.index_file import read_index
from fastloader.formats.pack_state import PackState
from fastloader.formats.tar_index_check import check_shard_index
from fastloader.formats.tar_index_digest import first_difference, index_digest
from fastloader.formats.tar_shards import IMAGE_EXTS, INDEX_KIND, INDEX_VERSION, default_index_path, scan_shard


def index_problems(path: str, state: PackState) -> list[str]:
    """The shards of the pack at ``path`` whose index says other than their members, or than the manifest."""
    problems = []
    for shard in state.shards:
        file = os.path.join(path, shard.name)
        try:
            index = read_index(default_index_path(file), INDEX_KIND, INDEX_VERSION)
        except (FileNotFoundError, FormatError):
            continue  # none, or not one a reader uses: a reader builds it from the shard, whose bytes are checked
        if not _used(file, index.meta, shard.sha256):
            continue  # a reader of the pack rebuilds it from the shard
        try:
            check_shard_index(index)
            scanned, scanned_meta = scan_shard(file)
        except (OSError, FormatError) as error:
            problems.append(f"{file}: its index cannot be checked ({error})")
            continue
        found = first_difference(file, index.arrays, index.meta, scanned, scanned_meta)
        if found is not None:
            problems.append(found)
        elif shard.index_sha256 is not None and index_digest(index.arrays, index.meta) != shard.index_sha256:
            problems.append(f"{file}: its index is not the one the manifest records (its index_sha256 differs)")
    return problems


def _used(file: str, meta: Mapping[str, Any], sha256: str | None) -> bool:
    """Whether a reader of the pack would use an index with ``meta`` (``fastloader.formats.tar_shards``): one
    for the default image extensions that names the shard's size and mtime, or the bytes the manifest records
    (a copy of the pack that lost its mtimes)."""
    stat = os.stat(file)
    if meta.get("image_exts") != list(IMAGE_EXTS):
        return False
    same_file = meta.get("shard_size") == stat.st_size and meta.get("shard_mtime_ns") == stat.st_mtime_ns
    return same_file or (sha256 is not None and meta.get("content_sha256") == sha256)


def undigested_problem(path: str, state: PackState) -> str | None:
    """The report's line for a pack whose manifest records its shards' bytes but not their indexes'."""
    hashed = all(shard.sha256 is not None for shard in state.shards)
    if not hashed or all(shard.index_sha256 is not None for shard in state.shards):
        return None  # a pack without content hashes has its own line (verify_content.unhashed_problem)
    return (
        f"{path}: cannot vouch for this tar pack's indexes when it is read: its manifest records no digest of "
        "each shard's index (written by an older fastloader). verify checked every index against its shard "
        "now, but a reader does not check them when it opens the pack; pack it again"
    )
