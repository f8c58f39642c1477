"""What the tar and Parquet sinks share (``fastloader.pack.shard_sink``): neither packs into another's directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastloader.errors import FormatError
from fastloader.pack.parquet_sink import ParquetSink
from fastloader.pack.tar_sink import TarShardSink
from tests.images import image_bytes


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
