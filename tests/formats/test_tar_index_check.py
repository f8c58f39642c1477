"""A tar shard's index whose values lie: a FormatError naming it (or, beside a local shard, a rebuild),
never an IndexError, a MemoryError or an OSError at a read; a lying catalog is caught at the read."""

from __future__ import annotations

import io
import tarfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastloader.datasets.tar import TarShardSource
from fastloader.datasets.tar_catalog import CATALOG_KIND, CATALOG_VERSION, write_catalog
from fastloader.errors import FormatError
from fastloader.formats.index_file import read_index, write_index
from fastloader.formats.tar_index_check import check_shard_index
from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION, default_index_path, load_shard_index
from tests.images import image_bytes

Arrays = dict[str, np.ndarray]
Meta = dict[str, Any]


def write_shard(path: Path, count: int = 4) -> list[bytes]:
    images = [image_bytes(i) for i in range(count)]
    with tarfile.open(path, "w") as tar:
        for i, image in enumerate(images):
            for ext, data in (("jpg", image), ("cls", str(i).encode()), ("txt", f"caption {i}".encode())):
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return images


def rewrite(path: Path, kind: str, version: int, change: Callable[[Arrays, Meta], None]) -> None:
    """The index at ``path`` written again with ``change`` applied to (a copy of) its arrays and meta."""
    index = read_index(path, kind, version)
    arrays = {name: np.array(array) for name, array in index.arrays.items()}
    meta = dict(index.meta)
    change(arrays, meta)
    write_index(path, kind, version, meta, arrays)


def _set(name: str, at: int, value: int) -> Callable[[Arrays, Meta], None]:
    def change(arrays: Arrays, meta: Meta) -> None:
        arrays[name][at] = value

    return change


def _meta(key: str, value: Any) -> Callable[[Arrays, Meta], None]:
    def change(arrays: Arrays, meta: Meta) -> None:
        meta[key] = value

    return change


def _drop_last(name: str) -> Callable[[Arrays, Meta], None]:
    def change(arrays: Arrays, meta: Meta) -> None:
        arrays[name] = arrays[name][:-1]

    return change


LIES = {
    "data_size 2**62": (_set("data_size", 1, 2**62), "reach outside"),
    "negative data_offset": (_set("data_offset", 0, -1), "reach outside"),
    "data past the shard": (_set("data_offset", 3, 10**9), "reach outside"),
    "member_size 2**62": (_set("member_size", 2, 2**62), "reach outside"),
    "samples above the arrays": (_meta("samples", 10), "holds 5 values, 11 expected"),
    "samples 2**62": (_meta("samples", 2**62), "expected"),
    "samples not a count": (_meta("samples", "4"), "not a count"),
    "a short label array": (_drop_last("label"), "'label' holds 3 values, 4 expected"),
    "an extension code past its table": (_set("ext", 2, 9), "codes outside its table"),
    "a member extension code past its table": (_set("member_ext", 0, 5), "codes outside its table"),
    "member_starts going back": (_set("member_starts", 2, 0), "do not run from 0"),
    "key offsets past the blob": (_set("key_offsets", 4, 10**6), "do not run from 0"),
    "exts not names": (_meta("exts", [1]), "not a list of names"),
}


@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_shard_index_is_refused_naming_it(tmp_path: Path, lie: str) -> None:
    change, message = LIES[lie]
    shard = tmp_path / "d.tar"
    write_shard(shard)
    index_path = default_index_path(shard)
    load_shard_index(str(shard))
    rewrite(index_path, INDEX_KIND, INDEX_VERSION, change)
    lying = read_index(index_path, INDEX_KIND, INDEX_VERSION)
    with pytest.raises(FormatError, match=message) as caught:
        check_shard_index(lying)
    assert str(index_path) in str(caught.value)
    # The path of an index fetched beside a remote shard: its catalog is refused, naming the index.
    with pytest.raises(FormatError, match=message):
        write_catalog(tmp_path / "catalog.fl-idx", [lying], [[str(shard), 0, 0]], ["jpg"])


@pytest.mark.parametrize("lie", list(LIES))
def test_beside_a_local_shard_a_lying_index_is_rebuilt(tmp_path: Path, lie: str) -> None:
    shard = tmp_path / "d.tar"
    images = write_shard(shard)
    load_shard_index(str(shard))
    rewrite(default_index_path(shard), INDEX_KIND, INDEX_VERSION, LIES[lie][0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source = TarShardSource(str(shard))
    assert any("rebuilding a shard index whose values do not hold" in str(w.message) for w in caught)
    assert [source.read(i) for i in range(4)] == images and [source.label(i) for i in range(4)] == [0, 1, 2, 3]
    assert [source.read_field(i, "txt") for i in range(4)] == [f"caption {i}" for i in range(4)]


@pytest.mark.parametrize(
    ("name", "value", "read"),
    [
        ("data_size", 2**62, lambda source: source.read(0)),
        ("data_offset", -1, lambda source: source.read(0)),
        ("member_offset", 10**9, lambda source: source.read_field(0, "txt")),
        ("ext", 200, lambda source: source.extension(0)),
    ],
)
def test_a_lying_catalog_is_caught_at_the_read_naming_the_sample(
    tmp_path: Path, name: str, value: int, read: Callable[[TarShardSource], object]
) -> None:
    shard = tmp_path / "d.tar"
    write_shard(shard)
    catalog = Path(TarShardSource(str(shard))._catalog.get().path)
    rewrite(catalog, CATALOG_KIND, CATALOG_VERSION, _set(name, 0, value))
    source = TarShardSource(str(shard))  # the catalog is current (the shard did not change): it is used
    with pytest.raises(FormatError, match=r"d.tar:s0: .*(outside the shard|not in the catalog)"):
        read(source)
    assert source.read(1) == image_bytes(1) and source.read_field(1, "txt") == "caption 1"  # the others read


def test_a_catalog_whose_arrays_are_short_is_refused(tmp_path: Path) -> None:
    shard = tmp_path / "d.tar"
    write_shard(shard)
    catalog = Path(TarShardSource(str(shard))._catalog.get().path)
    rewrite(catalog, CATALOG_KIND, CATALOG_VERSION, _drop_last("label"))
    with pytest.raises(FormatError, match="'label' holds 3 values, 4 expected"):
        TarShardSource(str(shard))


def test_an_offset_inside_a_tar_block_is_refused(tmp_path: Path) -> None:
    shard = tmp_path / "d.tar"
    write_shard(shard)
    load_shard_index(str(shard))
    rewrite(default_index_path(shard), INDEX_KIND, INDEX_VERSION, _set("data_offset", 1, 1000))
    with pytest.raises(FormatError, match="not at the start of a tar block"):
        check_shard_index(read_index(default_index_path(shard), INDEX_KIND, INDEX_VERSION))
