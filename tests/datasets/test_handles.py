"""Handles a process opens for itself: the bounded set of open handles every shard reader shares."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastloader.datasets.handles import OpenHandles


def test_at_most_limit_descriptors_stay_open_the_least_recently_used_closed_first(tmp_path: Path) -> None:
    paths = []
    for i in range(4):
        paths.append(tmp_path / f"shard-{i}")
        paths[-1].write_bytes(bytes([i]) * 8)
    closed: list[int] = []

    def close(fd: int) -> None:
        closed.append(fd)
        os.close(fd)

    handles = OpenHandles(lambda i: os.open(paths[i], os.O_RDONLY), close, limit=2)
    first, second = handles.get(0), handles.get(1)
    assert handles.get(0) == first  # open already: reused, and now the most recently used
    third = handles.get(2)  # evicts shard 1, the least recently used
    assert closed == [second] and len(handles) == 2
    assert os.pread(first, 1, 0) == b"\x00" and os.pread(third, 1, 0) == b"\x02"
    with pytest.raises(OSError):
        os.fstat(second)
    handles.close_all()
    assert sorted(closed) == sorted([first, second, third]) and len(handles) == 0


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be at least 1"):
        OpenHandles(lambda i: i, lambda h: None, limit=0)
