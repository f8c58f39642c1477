"""The sizes a Parquet footer announces, read without pyarrow: the same numbers as pyarrow's metadata for
files pyarrow writes, and for a damaged footer a FormatError naming the file, never another exception (on
some of those, asking pyarrow for a column chunk's metadata aborts the process)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastloader.errors import FormatError
from fastloader.formats.parquet_footer import PAGE_HEADER_BYTES, ChunkSizes, dictionary_page_size, read_chunk_sizes


def written(**options: Any) -> bytes:
    table = pa.table(
        {
            "image": [bytes([i]) * 300 for i in range(10)],
            "caption": ["same"] * 10,
            "meta": [{"w": i, "tags": ["a"] * (i % 3)} for i in range(10)],
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=4, **options)
    return out.getvalue()


def sizes_of(data: bytes, path: str = "f.parquet") -> list[list[ChunkSizes]]:
    return read_chunk_sizes(lambda at, count: data[at : at + count], len(data), path)


@pytest.mark.parametrize(
    "options", [{}, {"compression": "zstd"}, {"use_dictionary": False}, {"write_page_index": True}]
)
def test_the_sizes_are_those_pyarrow_reads(options: dict[str, Any]) -> None:
    data = written(**options)
    metadata = pq.read_metadata(pa.BufferReader(data))
    groups = sizes_of(data)
    assert len(groups) == metadata.num_row_groups == 3
    for g, chunks in enumerate(groups):
        assert len(chunks) == metadata.num_columns == 4  # meta.w and meta.tags.list.element are leaves
        for i, chunk in enumerate(chunks):
            theirs = metadata.row_group(g).column(i)
            assert chunk.path == tuple(theirs.path_in_schema.split("."))
            assert chunk.uncompressed == theirs.total_uncompressed_size
            assert chunk.num_values == theirs.num_values
            first = theirs.dictionary_page_offset if theirs.has_dictionary_page else theirs.data_page_offset
            assert chunk.first_page == first
            size = dictionary_page_size(data[first : first + PAGE_HEADER_BYTES])
            assert (size is not None) == theirs.has_dictionary_page


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2**32), st.integers(0, 255)), min_size=1, max_size=4), st.integers(0, 64))
def test_a_damaged_footer_is_a_format_error_naming_the_file(edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(written())
    length = int.from_bytes(data[-8:-4], "little")
    for at, value in edits:
        data[len(data) - 8 - length + at % (length + 8)] = value
    del data[len(data) - cut :]
    try:
        sizes_of(bytes(data), "damaged.parquet")
    except FormatError as error:
        assert str(error).startswith("damaged.parquet: not a readable Parquet file")


def test_a_footer_nested_without_end_is_refused_not_recursed(tmp_path: Path) -> None:
    footer = bytes([0x1C]) * 100_000  # field 1, a struct, again and again: 100,000 deep
    data = b"PAR1" + footer + len(footer).to_bytes(4, "little") + b"PAR1"
    with pytest.raises(FormatError, match="nested more than 64 deep"):
        sizes_of(data)
