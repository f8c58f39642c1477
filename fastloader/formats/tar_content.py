"""What a tar pack records of its shards' bytes, so that a changed shard or member is found and named.

* The manifest records each shard's ``size`` and ``sha256`` (of the whole file,
  :func:`file_sha256`): a shard flipped, truncated, appended to, replaced by another pack's or
  swapped with another shard of the pack differs from it.
* The shard's index, written by ``fastloader pack``, records the same ``content_sha256`` in its meta
  and ``member_digest``: one uint64 per tar member, in tar order, of its name and bytes
  (:func:`member_digest`). ``verify`` walks a shard whose hash differs and names each member whose
  digest differs, and the members added or missing.

Readers check at open what costs no read of the shard (:func:`check_expected`): the size and the
hash the shard's index recorded when it was built from the shard's bytes (an index is rebuilt, and
so the shard hashed again, whenever the shard's size or mtime changes). A byte changed in place
with the size and mtime kept (disk rot, a restored mtime) is found only by ``verify``, which reads
every byte.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from fastloader.errors import FormatError

_READ = 8 << 20


class Expected(NamedTuple):
    """A shard as the manifest records it: its size, the SHA-256 of its bytes and (tar packs of version 4)
    the digest of its index's arrays (:mod:`fastloader.formats.tar_index_digest`)."""

    size: int
    sha256: str
    index_sha256: str | None = None


def member_digest(name: str, data: bytes | memoryview) -> int:
    """The digest of a tar member: 64 bits of BLAKE2b over its name, a NUL and its bytes."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape") + b"\0", digest_size=8)
    digest.update(data)
    return int.from_bytes(digest.digest(), "little")


def fd_sha256(fd: int) -> str:
    """The SHA-256 of every byte of the file open as ``fd`` (read from its start, in 8 MB pieces)."""
    digest, offset = hashlib.sha256(), 0
    while piece := os.pread(fd, _READ, offset):
        digest.update(piece)
        offset += len(piece)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd_sha256(fd)
    finally:
        os.close(fd)


def check_expected(shard: str, meta: Mapping[str, Any], expected: Expected) -> None:
    """FormatError naming ``shard`` unless its index ``meta`` describes the bytes the manifest records."""
    if meta.get("shard_size") == expected.size and meta.get("content_sha256") == expected.sha256:
        return
    raise FormatError(
        f"{shard}: not the shard the pack's manifest records ({meta.get('shard_size')} bytes with SHA-256 "
        f"{str(meta.get('content_sha256'))[:16]}..., the manifest: {expected.size} bytes with "
        f"{expected.sha256[:16]}...): corrupted, replaced or swapped since it was packed; run "
        "`fastloader verify` on the pack, and pack it again"
    )
