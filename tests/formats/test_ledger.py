"""The delivery ledger's file (fastloader.formats.ledger): version 2 adds the samples an error policy did not deliver
as asked; a version 1 ledger (written before) still reads."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from fastloader.errors import FormatError
from fastloader.formats import ledger as layout
from fastloader.ledger import read_ledger


def _file(path: Path, version: int, *payloads: bytes) -> Path:
    path.write_bytes(struct.pack("<8sHII", layout.MAGIC, version, 0, 1) + b"".join(map(layout.block, payloads)))
    return path


def test_a_version_1_ledger_reads_as_one_without_policy_outcomes(tmp_path: Path) -> None:
    ids, crcs = np.array([2, 0], np.int64), np.array([7, 9], np.uint32)
    payload = layout.epoch_record(0, 0) + layout.key_record(2, "b.jpg") + layout.samples_record(0, ids, crcs, None)
    epoch = read_ledger(_file(tmp_path / "old", 1, payload)).ranks[0].epochs[0]
    assert (epoch.keys, epoch.crcs, epoch.replaced, epoch.skipped) == (["b.jpg", "0"], [7, 9], {}, [])


def test_the_samples_not_delivered_as_asked_read_back_where_they_were(tmp_path: Path) -> None:
    # Asked [3, 4, 5, 6]: 4 skipped (after one delivery), 6 replaced by 8 (the third delivered).
    ids = np.array([3, 5, 8], np.int64)
    asked = (np.array([4, 6], np.int64), np.array([-2, 2], np.int32))
    payload = layout.epoch_record(0, 0) + layout.samples_record(0, ids, None, None, asked=asked)
    [record] = layout.read_records(_file(tmp_path / "new", 2, payload).read_bytes(), "new")[1][1:]
    assert isinstance(record, layout.Samples) and record.asked is not None and record.slots is not None
    assert record.asked.tolist() == [4, 6] and record.slots.tolist() == [-2, 2]
    epoch = read_ledger(tmp_path / "new").ranks[0].epochs[0]
    assert (epoch.keys, epoch.replaced, epoch.skipped) == (["3", "5", "8"], {2: "6"}, [(1, "4")])


def test_a_ledger_of_a_later_version_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="later: ledger version 3; this fastloader reads versions 1 to 2"):
        read_ledger(_file(tmp_path / "later", 3))
