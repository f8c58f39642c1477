"""``fastloader verify FILE.rec``: an MXNet RecordIO file's index checked against a walk of the whole file.

The index (the ``.idx`` beside the file, through the index fastloader made of it) says where each key's record
starts. The walk finds every record's start, in file order, and the ``id`` of its header, which ``im2rec``
sets to the record's key: every entry must point at a record's start, and, when the file's records carry
their keys, at the record of its own key. An index shipped with two offsets swapped still lands on records
and reads; it fails here, naming the key. A file whose records do not carry their keys cannot be checked
so: the report says it cannot vouch for the index (not OK).
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from fastloader.datasets.recordio import IDS_ARE_KEYS, RecordIOSource, load_index
from fastloader.errors import FormatError, printable
from fastloader.formats.recordio import record_id, scan_offsets
from fastloader.storage import open_regular


def recordio_problems(path: str) -> tuple[int, list[str], list[int]]:
    """(entries checked, problems, positions of the bad entries) of the RecordIO file ``path``."""
    with warnings.catch_warnings():  # an index that cannot be checked is one of the report's problems
        warnings.simplefilter("ignore", UserWarning)
        source = RecordIOSource(path)  # the .idx beside it, as a reader would take it
    index = load_index(source.rec_path, source.idx_path)
    keys, offsets = np.asarray(index.arrays["keys"]), np.asarray(index.arrays["offsets"])
    where = printable(source.idx_path or path)
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        try:
            starts = scan_offsets(fd, size, path)
        except FormatError as error:
            return len(keys), [printable(str(error))], []
        ids = np.array([record_id(fd, int(start), size, path) for start in starts], np.int64)
    finally:
        os.close(fd)
    at = np.searchsorted(starts, offsets)
    found = (at < len(starts)) & (starts[np.minimum(at, len(starts) - 1)] == offsets)
    problems, bad = [], []
    for line in np.flatnonzero(~found):
        problems.append(f"{where}: key {int(keys[line])}: offset {int(offsets[line])} is not where a record starts")
        bad.append(int(line))
    if index.meta["ids"] != IDS_ARE_KEYS:
        problems.append(
            f"{where}: the records of {printable(path)} do not carry their keys as ids (not written by im2rec?):"
            " cannot vouch that the index leads each key to its record"
        )
        return len(keys), problems, bad
    id_at = ids[np.minimum(at, len(starts) - 1)]
    start_of = dict(zip(ids.tolist(), starts.tolist(), strict=True))
    for line in np.flatnonzero(found & (id_at != keys)):
        key, offset = int(keys[line]), int(offsets[line])
        own = start_of.get(key)
        its = f"its record starts at offset {own}" if own is not None else "no record has its id"
        problems.append(
            f"{where}: key {key}: the index points at offset {offset}, the record of key {int(id_at[line])}; {its}"
        )
        bad.append(int(line))
    return len(keys), problems, bad
