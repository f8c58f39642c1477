"""What a tar shard's index says about its shard, vouched for: its digest, and where it differs from a rescan.

An index (:mod:`fastloader.formats.tar_shards`) steers every read: an offset sends a read elsewhere in
the shard, a label is served as it is. Its own meta names the shard's size and SHA-256, but nothing in
it ties its arrays to those bytes: an index shipped with every label flipped still "fits" its shard.

* :func:`index_digest`: the SHA-256 of the arrays a scan of the shard gives (``SCANNED``) and of the
  meta that gives their codes a meaning (``exts``, ``member_exts``, ``image_exts``). ``fastloader pack``
  records it in the manifest (``index_sha256`` of each shard, tar packs of version 4), and a reader of
  the pack checks it before it trusts an index it did not build itself. The source keys and member
  digests an index of a pack also holds are not part of it: a scan cannot give them back (they name
  samples and members in messages; they steer no read).
* :func:`first_difference`: an index against the arrays a scan of its shard gives, the first sample
  where they differ named (``verify`` rescans every shard).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from fastloader.formats.index_file import string_at

SCANNED = (
    "key_blob",
    "key_offsets",
    "data_offset",
    "data_size",
    "ext",
    "label",
    "member_starts",
    "member_ext",
    "member_offset",
    "member_size",
)
_TABLES = ("image_exts", "exts", "member_exts")
_TAG = b"fastloader-tar-index-v1\0"


def index_digest(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the tables, then of each scanned array by name: its dtype, length and bytes."""
    digest = hashlib.sha256(_TAG)
    digest.update(json.dumps([meta.get(name) for name in _TABLES]).encode() + b"\0")
    for name in SCANNED:
        array = np.ascontiguousarray(arrays[name]) if name in arrays else np.zeros(0, np.uint8)
        digest.update(f"{name}\0{array.dtype.str}\0{len(array)}\0".encode())
        digest.update(array.tobytes())  # one shard's arrays: a few hundred KB
    return digest.hexdigest()


def _sample(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Sample ``index`` as the index describes it: its key, image, label and other members (by extension)."""
    exts, member_exts = list(meta.get("exts") or []), list(meta.get("member_exts") or [])

    def name(table: list[str], code: int) -> str:
        return table[code] if 0 <= code < len(table) else f"code {code}"

    start, end = int(arrays["member_starts"][index]), int(arrays["member_starts"][index + 1])
    return {
        "key": string_at(arrays["key_blob"], arrays["key_offsets"], index),
        "image": (
            name(exts, int(arrays["ext"][index])),
            int(arrays["data_offset"][index]),
            int(arrays["data_size"][index]),
        ),
        "label": int(arrays["label"][index]),
        "members": [
            (
                name(member_exts, int(arrays["member_ext"][row])),
                int(arrays["member_offset"][row]),
                int(arrays["member_size"][row]),
            )
            for row in range(start, end)
        ],
    }


def first_difference(
    shard: str,
    arrays: Mapping[str, np.ndarray],
    meta: Mapping[str, Any],
    scanned: Mapping[str, np.ndarray],
    scanned_meta: Mapping[str, Any],
) -> str | None:
    """Where an index (``arrays``, ``meta``) says other than a scan of ``shard`` gives (``scanned``), naming
    the first sample that differs; None when they agree. The index's values are checked already
    (:func:`~fastloader.formats.tar_index_check.check_shard_index`)."""
    if index_digest(arrays, meta) == index_digest(scanned, scanned_meta):
        return None
    mine, theirs = len(arrays["label"]), len(scanned["label"])
    for index in range(min(mine, theirs)):
        found, real = _sample(arrays, meta, index), _sample(scanned, scanned_meta, index)
        for what in ("key", "label", "image", "members"):
            if found[what] != real[what]:
                return (
                    f"{shard}: its index does not describe the shard's members: sample {index} (key "
                    f"{real['key']!r}): {what} {found[what]!r} in the index, {real[what]!r} in the shard"
                )
    if mine != theirs:
        return f"{shard}: its index lists {mine} samples, the shard's members make {theirs}"
    return f"{shard}: its index's tables of extensions are not those a scan of the shard gives"
