"""``verify`` of a shard pack's bytes: every data file against the size and SHA-256 its manifest records.

A tar pack (version 3) or a Parquet pack (version 2) records both for each data file; reading every
byte again finds a flipped bit anywhere (an image, a label, a header), an appended or removed tar
member, a file from another pack (even with the same count) and two files swapped (named as such).
In a tar shard that differs, each member is then checked against the digest of its name and bytes
that its index recorded when it was packed (:mod:`fastloader.formats.tar_content`), so the report
names the member. The class names of the manifest are checked against the digest of the source's
that the fingerprint records (``fastloader.pack.source_items``). A pack written before these were
recorded cannot be checked this way, and the report says so (it is not OK).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from fastloader.errors import FormatError
from fastloader.formats.index_file import read_index
from fastloader.formats.pack_state import PackState, ShardRecord, classes_edited
from fastloader.formats.tar_content import Expected, file_sha256, member_digest
from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION, default_index_path, walk_members
from fastloader.storage import open_regular

_MEMBERS_NAMED = 10  # changed members named per shard


def expected_of(shard: ShardRecord) -> Expected | None:
    return (
        None if shard.size is None or shard.sha256 is None else Expected(shard.size, shard.sha256, shard.index_sha256)
    )


def unhashed_problem(path: str, state: PackState) -> str | None:
    """The report's line for a pack whose manifest records no content hashes (written before they were)."""
    if all(expected_of(shard) is not None for shard in state.shards):
        return None
    return (
        f"{path}: cannot check the bytes of this {state.WHAT} pack: its manifest records no size and SHA-256 of "
        "its files (written by an older fastloader), so a flipped byte, an edited label or a swapped file would "
        "go unseen; pack it again to be able to verify it"
    )


def content_problems(path: str, state: PackState, members: bool) -> list[str]:
    """Each data file the manifest records, read whole, against its size and SHA-256 (``members``: a tar
    shard that differs is also checked member by member)."""
    by_hash = {shard.sha256: shard.name for shard in state.shards if shard.sha256 is not None}
    problems: list[str] = []
    for shard in state.shards:
        expected = expected_of(shard)
        if expected is None:
            continue
        file = os.path.join(path, shard.name)
        try:
            size, sha256 = os.stat(file).st_size, file_sha256(file)
        except OSError as error:
            problems.append(f"{file}: unreadable ({type(error).__name__}: {error})")
            continue
        if (size, sha256) == (expected.size, expected.sha256):
            continue
        other = by_hash.get(sha256)
        if other is not None:
            problems.append(f"{file}: holds the bytes the manifest records for {other} (files swapped or renamed)")
            continue
        cut = " (truncated)" if size < expected.size else ""
        problems.append(
            f"{file}: not the bytes that were packed{cut}: {size} bytes, SHA-256 {sha256[:16]}...; the manifest "
            f"records {expected.size} bytes, {expected.sha256[:16]}... (corrupted, edited, or from another pack)"
        )
        if members:
            problems += member_problems(file)
    return problems


def member_problems(shard: str) -> list[str]:
    """The members of ``shard`` that are not among those its pack-time index recorded (by name and bytes),
    and how many recorded ones are gone."""
    try:
        recorded = np.asarray(read_index(default_index_path(shard), INDEX_KIND, INDEX_VERSION).arrays["member_digest"])
    except (FileNotFoundError, FormatError, KeyError):
        return [f"{shard}: its index holds no member digests (rebuilt since the pack?), so the changes are not named"]
    packed = Counter(int(digest) for digest in recorded)  # one shard's members: a few thousand entries
    found: list[str] = []
    order: list[int] = []
    fd = open_regular(shard)
    try:
        for member in walk_members(fd, shard):
            digest = member_digest(member.name, os.pread(fd, member.size, member.offset))
            order.append(digest)
            if packed[digest] > 0:
                packed[digest] -= 1
            else:
                found.append(f"{shard}: member {member.name!r} is not one that was packed (changed, renamed or added)")
    except FormatError as error:
        found.append(str(error))
    finally:
        os.close(fd)
    gone = sum(packed.values()) - len(found)
    if gone > 0:
        found.append(f"{shard}: {gone} of the {len(recorded)} members packed are gone")
    if not found and order != [int(digest) for digest in recorded]:
        found.append(f"{shard}: its members are not in the order they were packed")
    if len(found) > _MEMBERS_NAMED:
        found = [*found[:_MEMBERS_NAMED], f"{shard}: ... and {len(found) - _MEMBERS_NAMED} more member problems"]
    return found


def classes_problems(path: str, fingerprint: dict[str, Any], classes: Any) -> list[str]:
    """A pack's class names against the digest of the source's that its fingerprint records."""
    if not classes_edited(fingerprint, classes):
        return []
    shown = None if classes is None else list(classes)
    return [f"{path}: the pack's class names ({shown!r}) are not those of the source packed (edited?)"]
