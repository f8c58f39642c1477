"""Whether a tar shard's index (``fastloader.formats.tar_shards``) can be trusted to index its shard.

An index is read back from beside the shard, from the cache, or fetched beside a remote shard; any of
its values may lie (a corrupted or hand-edited file, an index of another shard). Before its arrays are
used, every count is checked against the arrays' lengths, every offset table to run in order over
what it indexes, every (offset, size) to lie within the shard, and every code to name an entry of its
table: a lie is a :class:`~fastloader.errors.FormatError` naming the index, never an ``IndexError``,
a ``MemoryError`` or an ``OSError`` at a read.
"""

from __future__ import annotations

import numpy as np

from fastloader.errors import FormatError
from fastloader.formats.index_file import (
    IndexFile,
    check_codes,
    check_csr,
    check_spans,
    meta_count,
    meta_strings,
    require_array,
)

_BLOCK = 512


def check_shard_index(index: IndexFile) -> None:
    """FormatError naming ``index`` unless its values agree with each other and with its shard's size."""
    samples, shard_size = meta_count(index, "samples"), meta_count(index, "shard_size")
    meta_count(index, "no_image")
    meta_count(index, "ignored")
    exts, member_exts = meta_strings(index, "exts"), meta_strings(index, "member_exts")
    meta_strings(index, "image_exts")
    check_csr(index, "key_offsets", samples, len(require_array(index, "key_blob", np.uint8)))
    check_spans(index, "data_offset", "data_size", samples, shard_size)
    _check_blocks(index, "data_offset")
    check_codes(index, "ext", np.uint8, samples, len(exts))
    require_array(index, "label", np.int64, samples)
    members = len(require_array(index, "member_ext", np.int32))
    check_csr(index, "member_starts", samples, members)
    check_codes(index, "member_ext", np.int32, members, len(member_exts))
    check_spans(index, "member_offset", "member_size", members, shard_size)
    _check_blocks(index, "member_offset")
    if "member_digest" in index.arrays:
        require_array(index, "member_digest", np.uint64)
    if "source_key_blob" in index.arrays or "source_key_offsets" in index.arrays:
        check_csr(index, "source_key_offsets", samples, len(require_array(index, "source_key_blob", np.uint8)))


def _check_blocks(index: IndexFile, name: str) -> None:
    """A tar member's data starts on a 512-byte block, after its header."""
    offsets = index.arrays[name]
    if len(offsets) and bool((offsets % _BLOCK != 0).any()):
        raise FormatError(f"{index.path}: {name!r} holds offsets that are not at the start of a tar block")
