"""What the tar and Parquet sinks share (``fastloader.pack.shard_sink``): neither packs into another's directory,
an item is written whole or not at all, and a failed commit is never recorded."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from fastloader.datasets.sources import open_source
from fastloader.errors import FormatError
from fastloader.fields.source import read_fields
from fastloader.pack import shard_sink
from fastloader.pack.parquet_sink import ParquetSink
from fastloader.pack.tar_sink import TarShardSink
from tests.images import image_bytes, pack_contents


@pytest.mark.parametrize("sink_type", [TarShardSink, ParquetSink])
def test_a_destination_holding_another_format_or_a_file_is_refused(tmp_path: Path, sink_type: type) -> None:
    for other_type, what in ((TarShardSink, "tar"), (ParquetSink, "Parquet")):
        if other_type is not sink_type:
            other = other_type(tmp_path / what, {"n": 1})
            other.add(0, "k0", 0, image_bytes(0))
            other.finish(None, {})
            with pytest.raises(FormatError, match=f"{tmp_path / what}: holds a {what} pack; pack .* into a new"):
                sink_type(tmp_path / what, {"n": 1})
    (tmp_path / "lmdb").mkdir()
    (tmp_path / "lmdb" / "data.mdb").write_bytes(b"")
    with pytest.raises(FormatError, match="holds a LMDB pack"):
        sink_type(tmp_path / "lmdb", {"n": 1})
    (tmp_path / "file").write_text("x")
    with pytest.raises(FormatError, match="file: exists and is not a directory"):
        sink_type(tmp_path / "file", {"n": 1})
    with pytest.raises(ValueError, match="fingerprint must be a JSON-serialisable dict"):
        sink_type(tmp_path / "new", {"n": object()})


@pytest.mark.parametrize("sink_type", [TarShardSink, ParquetSink])
def test_an_item_that_cannot_be_encoded_leaves_nothing_behind(tmp_path: Path, sink_type: type) -> None:
    """A lone surrogate is a valid str (and valid JSON text) that no UTF-8 output can hold: the item is refused
    whole, never half a row (Parquet once buffered its key, image and label before encoding the fields)."""
    sink = sink_type(tmp_path / "out", {"n": 1}, shard_size=3, fields={"j": "json", "t": "text"})
    good = {"j": {"a": 1}, "t": "fine"}
    for position in range(8):
        if position in (1, 5):
            bad = {**good, "j": {"a": "\ud800"}} if position == 1 else {**good, "t": "\udcff"}
            with pytest.raises(ValueError, match=f"k{position}: field '[jt]': 'utf-8' codec can't encode"):
                sink.add(position, f"k{position}", 1, image_bytes(position), bad)
            sink.add_skipped(position, f"k{position}", "rejected")
        else:
            sink.add(position, f"k{position}", position % 3, image_bytes(position), good)
    sink.finish(None, {})
    kept = [0, 2, 3, 4, 6, 7]
    assert pack_contents(tmp_path / "out") == [(f"k{i}", i % 3, image_bytes(i)) for i in kept]
    source, _ = open_source(str(tmp_path / "out"))
    assert [read_fields(source, i) for i in range(len(source))] == [good] * len(kept)


@pytest.mark.parametrize("sink_type", [TarShardSink, ParquetSink])
def test_a_sink_whose_commit_failed_records_nothing_more(
    tmp_path: Path, sink_type: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst = tmp_path / "out"
    sink = sink_type(dst, {"n": 1}, shard_size=2)
    for position in range(2):
        sink.add(position, f"k{position}", 0, image_bytes(position))
    real_fsync = shard_sink._fsync_directory
    with monkeypatch.context() as patch:  # the second file is renamed into place, then the directory fsync fails
        patch.setattr(shard_sink, "_fsync_directory", lambda path: _no_space())
        sink.add(2, "k2", 0, image_bytes(2))
        with pytest.raises(OSError, match="No space left"):
            sink.add(3, "k3", 0, image_bytes(3))
    assert shard_sink._fsync_directory is real_fsync and (dst / f"{sink.prefix}-000001{sink.SUFFIX}").exists()
    for call in (lambda: sink.add_skipped(4, "k4", "x"), sink.checkpoint, lambda: sink.finish(None, {})):
        with pytest.raises(
            RuntimeError, match=f"{dst}: an earlier write failed \\(OSError: .*No space left.*\\); this"
        ):
            call()
    sink.close()  # records nothing: the progress still ends with the first file
    again = sink_type(dst, {"n": 1}, shard_size=2)
    assert again.resume_position() == 2 and not (dst / f"{sink.prefix}-000001{sink.SUFFIX}").exists()
    for position in range(2, 5):
        again.add(position, f"k{position}", 0, image_bytes(position))
    again.finish(None, {})
    assert pack_contents(dst) == [(f"k{i}", 0, image_bytes(i)) for i in range(5)]


def _no_space() -> None:
    raise OSError(errno.ENOSPC, "No space left on device (injected)")
