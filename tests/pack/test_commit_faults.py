"""A fault at each step of a pack's commits, then the same pack again: every good sample exactly once.

Each test makes one real call fail (an fsync, a rename, the index or footer written or read back, the
progress or manifest write, an LMDB commit or map growth) with ENOSPC, as a full disk would, the
second time it is made (so one file or transaction is already durable), runs ``pack`` into it, then
runs the same ``pack`` again without the fault and checks the result sample by sample.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lmdb
import pyarrow.parquet as pq
import pytest

from fastloader.formats.parquet_pack import ParquetPackState
from fastloader.formats.tar_manifest import TarPackState
from fastloader.pack import shard_sink, tar_sink
from fastloader.pack.engine import pack
from fastloader.pack.lmdb_sink import LMDBSink
from fastloader.pack.verify import verify
from tests.images import image_bytes, pack_contents, write_image_folder

SHARD = 8  # 40 good images: five files, or five LMDB transactions
BAD = "class_1/bad.jpg"  # an empty file: skipped, between the good ones


class Fault:
    """Counts the calls it is asked about and fails the ``nth`` with ENOSPC (once)."""

    def __init__(self, nth: int = 2) -> None:
        self.nth, self.calls, self.fired = nth, 0, False

    def due(self) -> bool:
        self.calls += 1
        return self.calls == self.nth

    def fail(self) -> None:
        self.fired = True
        raise OSError(errno.ENOSPC, "No space left on device (injected)")


def inject(
    patch: pytest.MonkeyPatch,
    owner: Any,
    name: str,
    match: Callable[..., bool] = lambda *args, **kwargs: True,
    nth: int = 2,
    after: Callable[..., None] | None = None,
) -> Fault:
    """Make the ``nth`` call of ``owner.name`` whose arguments ``match`` fail; ``after``: it took effect first
    (the original ran, then ``after(result, *args)``), as when a write lands and only its report fails."""
    fault, original = Fault(nth), getattr(owner, name)

    def faulty(*args: Any, **kwargs: Any) -> Any:
        if not (match(*args, **kwargs) and fault.due()):
            return original(*args, **kwargs)
        if after is not None:
            after(original(*args, **kwargs), *args)
        fault.fail()

    patch.setattr(owner, name, faulty)
    return fault


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _truncate_index(index: Any, shard: str, index_path: Path, *rest: Any) -> None:
    with open(index_path, "r+b") as file:  # an index cut short, as a crash inside a non-atomic write leaves
        file.truncate(os.path.getsize(index_path) // 2)


def _short_footer(patch: pytest.MonkeyPatch) -> Fault:
    """The footer read back counts one row fewer than were written (a file that lies about itself)."""
    fault, original = Fault(), pq.read_metadata

    def read_metadata(path: Any, *args: Any, **kwargs: Any) -> Any:
        meta = original(path, *args, **kwargs)
        if not fault.due():
            return meta
        fault.fired = True
        return SimpleNamespace(num_rows=meta.num_rows - 1)

    patch.setattr(pq, "read_metadata", read_metadata)
    return fault


def _state_write(state: type, which: str, nth: int) -> Callable[[pytest.MonkeyPatch], Fault]:
    name = getattr(state, which)
    return lambda patch: inject(
        patch, shard_sink, "atomic_write_bytes", lambda path, data: Path(path).name == name, nth
    )


def _sharded_steps(prefix: str, temporary: str, state: type) -> dict[str, Callable[[pytest.MonkeyPatch], Fault]]:
    """The commit steps the tar and Parquet sinks share: the data file's fsync and rename, then the bookkeeping."""

    def open_file(path: str | os.PathLike[str]) -> bool:  # the temporary of a data file being written
        return f"/.{prefix}-" in os.fspath(path) and os.fspath(path).endswith(temporary)

    return {
        "data fsync": lambda patch: inject(patch, os, "fsync", lambda fd: open_file(_fd_path(fd))),
        "rename": lambda patch: inject(patch, os, "replace", lambda src, dst: open_file(src)),
        "directory fsync": lambda patch: inject(patch, shard_sink, "_fsync_directory"),
        "progress write": _state_write(state, "PROGRESS_NAME", nth=2),
        "manifest write": _state_write(state, "MANIFEST_NAME", nth=1),
    }


STEPS: dict[str, dict[str, Callable[[pytest.MonkeyPatch], Fault]]] = {
    "tar": {
        "member write": lambda patch: inject(patch, tar_sink._OpenShard, "add_member", nth=SHARD * 2 + 3),
        **_sharded_steps("shard", ".partial", TarPackState),
        "index write": lambda patch: inject(patch, tar_sink, "build_shard_index"),
        "index fsync": lambda patch: inject(patch, os, "fsync", lambda fd: ".tar.fl-idx." in _fd_path(fd)),
        "index partial": lambda patch: inject(patch, tar_sink, "build_shard_index", after=_truncate_index),
    },
    "parquet": {
        "row group write": lambda patch: inject(patch, pq.ParquetWriter, "write_table"),
        "footer write": lambda patch: inject(patch, pq.ParquetWriter, "close"),
        **_sharded_steps("part", ".tmp", ParquetPackState),
        "footer read-back": lambda patch: inject(patch, pq, "read_metadata"),
        "footer counts wrong": _short_footer,
    },
    "lmdb": {
        "put": lambda patch: _lmdb_fault(patch, "put", nth=SHARD * 3 + 2),
        "commit": lambda patch: _lmdb_fault(patch, "commit"),
        "commit landed": lambda patch: _lmdb_fault(patch, "commit", after=True),
        "map growth": lambda patch: _lmdb_fault(patch, "set_mapsize"),
    },
}


class _Faulty:
    """An LMDB environment or write transaction whose method ``name`` goes through ``fault``."""

    def __init__(self, inner: Any, name: str, fault: Fault, after: bool) -> None:
        self._inner, self._name, self._fault, self._after = inner, name, fault, after

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)
        if attr == "begin":
            return lambda **kwargs: self._wrap(value(**kwargs)) if kwargs.get("write") else value(**kwargs)
        if attr != self._name:
            return value

        def faulty(*args: Any) -> Any:
            if not self._fault.due():
                return value(*args)
            if self._after:
                value(*args)
            self._fault.fail()

        return faulty

    def _wrap(self, inner: Any) -> _Faulty:
        return _Faulty(inner, self._name, self._fault, self._after)


def _lmdb_fault(patch: pytest.MonkeyPatch, name: str, nth: int = 2, after: bool = False) -> Fault:
    fault, original = Fault(nth), lmdb.open
    patch.setattr(lmdb, "open", lambda *args, **kwargs: _Faulty(original(*args, **kwargs), name, fault, after))
    return fault


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, int, bytes]]]:
    root = tmp_path_factory.mktemp("faults") / "images"
    items = write_image_folder(root, count=5 * SHARD)
    (root / BAD).write_bytes(b"")
    return root, items


def _pack(root: Path, dst: Path, output: str) -> Any:
    # A small first map: the LMDB grows it several times (the "map growth" step).
    options = {"map_size": 64 << 10} if output == "lmdb" else {}
    return pack(root, dst, format=output, shard_size=SHARD, commit_every=SHARD, workers=0, progress=False, **options)


CASES = [(output, step) for output, steps in STEPS.items() for step in steps]


@pytest.mark.parametrize(("output", "step"), CASES, ids=[f"{output}: {step}" for output, step in CASES])
def test_a_fault_at_any_commit_step_then_the_same_pack_gives_every_good_sample_once(
    folder: tuple[Path, list[tuple[str, int, bytes]]], tmp_path: Path, output: str, step: str
) -> None:
    root, items = folder
    dst = tmp_path / "out"
    with pytest.MonkeyPatch.context() as patch:
        fault = STEPS[output][step](patch)
        with pytest.raises((OSError, RuntimeError)) as failed:
            _pack(root, dst, output)
    assert fault.fired and str(dst) in str(failed.value)
    summary = _pack(root, dst, output)
    assert (summary.total, summary.packed) == (len(items) + 1, len(items))
    assert [(item.key, item.reason) for item in summary.skipped] == [(BAD, "empty: 0 bytes")]
    assert pack_contents(dst) == items  # every good sample once, in order: keys, labels and image bytes
    report = verify(dst)
    assert report.ok and report.checked == len(items), report.problems


def test_an_lmdb_sink_whose_commit_failed_writes_nothing_more(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    with pytest.MonkeyPatch.context() as patch:
        _lmdb_fault(patch, "commit", nth=1)
        sink = LMDBSink(dst, {"n": 1}, commit_every=2)
        sink.add(0, "k0", 0, image_bytes(0))
        with pytest.raises(OSError, match="No space left"):
            sink.add(1, "k1", 0, image_bytes(1))  # the batch's commit fails
        for call in (lambda: sink.add(2, "k2", 0, image_bytes(2)), sink.checkpoint, lambda: sink.finish(None, {})):
            with pytest.raises(RuntimeError, match=f"{dst}: an earlier write failed \\(OSError: .*\\); this sink"):
                call()
        sink.close()
    again = LMDBSink(dst, {"n": 1}, commit_every=2)
    assert again.resume_position() == 0
    for position in range(3):
        again.add(position, f"k{position}", 0, image_bytes(position))
    again.finish(None, {})
    assert pack_contents(dst) == [(f"k{i}", 0, image_bytes(i)) for i in range(3)]
