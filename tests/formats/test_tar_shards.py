"""Tar shard indexing: WebDataset grouping on real tars from Python's tarfile, malformed and evil tars,
and the index built once, reused, and rebuilt when the shard changes."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastloader.errors import FormatError
from fastloader.formats.index_file import IndexFile, pack_strings, read_index, string_at, write_index
from fastloader.formats.tar_shards import (
    INDEX_KIND,
    INDEX_VERSION,
    build_shard_index,
    load_shard_index,
    split_key,
    upgrade_index,
    walk_members,
)

LONG_KEY = "deep/" + "d" * 120 + "/" + "k" * 110  # needs a GNU long name or a pax path


def encode(fmt: str = "JPEG", mode: str = "RGB", seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (32, 32, 4), dtype=np.uint8)
    image = Image.fromarray(pixels[:, :, :3]).convert(mode)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT) -> None:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def add_special(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    tar.addfile(info)


def keys_of(index_arrays: dict[str, np.ndarray]) -> list[str]:
    blob, offsets = index_arrays["key_blob"], index_arrays["key_offsets"]
    return [string_at(blob, offsets, i) for i in range(len(offsets) - 1)]


def test_split_key_follows_webdataset() -> None:
    assert split_key("a/b/x.seg.PNG") == ("a/b/x", "seg.png")
    assert split_key("x.jpg") == ("x", "jpg")
    assert split_key("a.b/readme") is None  # a dot in the directory only: no extension
    assert split_key("dir/.hidden.jpg") is None


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_header_walk_matches_tarfile(tmp_path: Path, fmt: int) -> None:
    names = ["a.jpg", "p" * 90 + "/" + "q" * 90 + ".jpg"]  # the second needs the ustar prefix field
    if fmt != tarfile.USTAR_FORMAT:
        names += [LONG_KEY + ".jpg", "ünï/çødé.png"]
    path = tmp_path / "s.tar"
    write_tar(path, [(name, f"data of {name}".encode() * (i + 1)) for i, name in enumerate(names)], fmt)
    fd = os.open(path, os.O_RDONLY)
    try:
        walked = [(m.name, m.offset, m.size) for m in walk_members(fd, str(path))]
    finally:
        os.close(fd)
    with tarfile.open(path) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar.getmembers()]
    assert walked == expected and [name for name, _, _ in walked] == names


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_webdataset_layout_written_by_tarfile(tmp_path: Path, fmt: int) -> None:
    images = {key: encode("PNG" if i % 2 else "JPEG", seed=i) for i, key in enumerate("abcdefgh")}
    members = [
        ("n01/sub/img_001.jpg", images["a"]),
        ("n01/sub/img_001.cls", b"3"),
        ("n01/sub/img_002.png", images["b"]),
        ("n01/sub/img_002.json", b'{"caption": "x"}'),
        ("n01/sub/img_002.cls", b"  7\n"),
        ("img_003.JPG", images["c"]),  # no label, upper-case extension
        ("img_004.txt", b"text only: no image"),
        ("README", b"no extension: part of no sample"),
        (LONG_KEY + ".jpg", images["d"]),
        (LONG_KEY + ".cls", b"1"),
        ("both.png", images["e"]),
        ("both.jpg", images["f"]),  # jpg preferred over png
        ("both.label", b"5"),
        ("both.cls", b"4"),  # cls preferred over label
        ("./dotslash.seg.png", b"not the image"),
        ("./dotslash.webp", images["g"]),
    ]
    path = tmp_path / "wds.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        add_special(tar, "n01", tarfile.DIRTYPE)
        add_special(tar, "n01/sub", tarfile.DIRTYPE)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    index = build_shard_index(str(path), tmp_path / "wds.idx")
    arrays = dict(index.arrays)
    assert keys_of(arrays) == ["n01/sub/img_001", "n01/sub/img_002", "img_003", LONG_KEY, "both", "dotslash"]
    assert arrays["label"].tolist() == [3, 7, -1, 1, 4, -1]
    assert [index.meta["exts"][code] for code in arrays["ext"]] == ["jpg", "png", "jpg", "jpg", "jpg", "webp"]
    assert index.meta["no_image"] == 1 and index.meta["ignored"] == 0
    with open(path, "rb") as shard:
        data = shard.read()
    for i, key in enumerate("abcdfg"):
        offset, size = int(arrays["data_offset"][i]), int(arrays["data_size"][i])
        assert data[offset : offset + size] == images[key]
    # Every other member, in tar order: the label ones that lost to .cls, and a second image, too.
    assert members_of(index, data) == [
        [],
        [("json", b'{"caption": "x"}')],
        [],
        [],
        [("png", images["e"]), ("label", b"5")],
        [("seg.png", b"not the image")],
    ]


def members_of(index: IndexFile, data: bytes) -> list[list[tuple[str, bytes]]]:
    """(extension, bytes) of each sample's members besides its image and label, from the index's CSR arrays."""
    arrays, exts = index.arrays, index.meta["member_exts"]
    starts = arrays["member_starts"].tolist()
    assert starts[0] == 0 and starts[-1] == len(arrays["member_ext"]) == len(arrays["member_offset"])
    samples = []
    for i in range(len(starts) - 1):
        rows = range(starts[i], starts[i + 1])
        offsets, sizes = arrays["member_offset"], arrays["member_size"]
        samples.append([(exts[arrays["member_ext"][r]], data[offsets[r] : offsets[r] + sizes[r]]) for r in rows])
    return samples


def test_index_keeps_members_of_any_extension(tmp_path: Path) -> None:
    members = [
        ("a.jpg", encode()),
        ("a.txt", "text ü".encode()),
        ("a.json", b"{}"),
        ("a.cls", b"1"),
        ("a.seg.png", encode("PNG")),
        ("a.npy", b"\x93NUMPY"),
        ("a.anything.else", b""),  # empty
        ("b.png", encode("PNG", seed=1)),
        ("b.npy", b"npy of b"),
    ]
    path = tmp_path / "m.tar"
    write_tar(path, members)
    index = build_shard_index(str(path), tmp_path / "m.idx")
    assert index.meta["member_exts"] == ["txt", "json", "seg.png", "npy", "anything.else"]
    assert index.arrays["member_ext"].dtype == np.int32 and index.arrays["member_starts"].tolist() == [0, 5, 6]
    expected = [(name.split(".", 1)[1], data) for name, data in members[1:7] if name != "a.cls"]
    assert members_of(index, path.read_bytes()) == [expected, [("npy", b"npy of b")]]


def index_as_version_1(path: str | Path) -> None:
    """Rewrite the index at ``path`` as fastloader wrote it before fields: no member arrays."""
    index = read_index(path, INDEX_KIND, INDEX_VERSION)
    arrays = {name: np.asarray(a) for name, a in index.arrays.items() if not name.startswith("member_")}
    write_index(path, INDEX_KIND, 1, {k: v for k, v in index.meta.items() if k != "member_exts"}, arrays)


def test_version_1_indexes_are_upgraded_when_a_pack_wrote_them_else_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "v1.tar"
    write_tar(path, [("a.jpg", b"1"), ("a.txt", b"caption"), ("b.jpg", b"2")])
    plain = load_shard_index(str(path))
    index_as_version_1(Path(plain.path))
    rebuilt = load_shard_index(str(path))  # a plain shard's: its members were never indexed
    assert rebuilt.meta["member_exts"] == ["txt"] and rebuilt.arrays["member_starts"].tolist() == [0, 1, 1]
    blob, offsets = pack_strings(["src/a", "src/b"])
    packed = build_shard_index(
        str(path), tmp_path / "packed.idx", extra_arrays={"source_key_blob": blob, "source_key_offsets": offsets}
    )
    index_as_version_1(Path(packed.path))
    upgraded = upgrade_index(packed.path, lambda meta: True)
    assert upgraded is not None and upgraded.version == INDEX_VERSION and upgraded.meta["member_exts"] == []
    assert upgraded.arrays["member_starts"].tolist() == [0, 0, 0]
    assert keys_of(dict(upgraded.arrays)) == ["a", "b"] and bytes(upgraded.arrays["source_key_blob"]) == b"src/asrc/b"
    index_as_version_1(Path(packed.path))
    assert upgrade_index(packed.path, lambda meta: False) is None  # the shard changed since: rebuild
    assert upgrade_index(tmp_path / "missing.idx", lambda meta: True) is None


def _two_member_tar(tmp_path: Path) -> tuple[Path, bytes, list[tarfile.TarInfo]]:
    path = tmp_path / "t.tar"
    write_tar(path, [("a.jpg", b"x" * 3000), ("b.jpg", b"y" * 3000)], tarfile.USTAR_FORMAT)
    with tarfile.open(path) as tar:
        infos = tar.getmembers()
    return path, path.read_bytes(), infos


def _index_error(path: Path) -> str:
    with pytest.raises(FormatError) as error:
        build_shard_index(str(path), str(path) + ".idx")
    return str(error.value)


def test_truncated_tars_raise_format_errors_naming_shard_and_member(tmp_path: Path) -> None:
    path, data, infos = _two_member_tar(tmp_path)
    path.write_bytes(data[: infos[1].offset_data + 1000])  # cut inside b.jpg's data
    message = _index_error(path)
    assert str(path) in message and "'b.jpg'" in message and "truncated" in message
    path.write_bytes(data[: infos[1].offset + 100])  # cut inside b.jpg's header
    assert "truncated tar header at byte" in _index_error(path)
    path.write_bytes(data[: infos[1].offset])  # cut exactly between the members: readable, but suspicious
    with pytest.warns(UserWarning, match="no end-of-archive marker; the file may be truncated"):
        assert build_shard_index(str(path), tmp_path / "cut.idx").meta["samples"] == 1


def test_corrupt_headers_raise_format_errors(tmp_path: Path) -> None:
    path, data, infos = _two_member_tar(tmp_path)
    corrupt = bytearray(data)
    corrupt[infos[1].offset] ^= 0x01  # one bit of b.jpg's name: checksum no longer matches
    path.write_bytes(bytes(corrupt))
    assert f"corrupt tar header at byte {infos[1].offset} (bad header checksum)" in _index_error(path)
    # A size far past the end, with a correct checksum: refused, not allocated.
    header = bytearray(data[: infos[1].offset + 512][infos[1].offset :])
    header[124:136] = b"77777777777\x00"
    header[148:156] = b"        "
    header[148:156] = b"%06o\x00 " % sum(header)
    corrupt[infos[1].offset : infos[1].offset + 512] = header
    path.write_bytes(bytes(corrupt))
    assert "claims 8589934591 bytes" in _index_error(path)


def test_signed_header_checksums_of_old_writers_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "old.tar"
    write_tar(path, [("ü.jpg", b"x")])  # bytes above 127 in the name: signed and unsigned sums differ
    data = bytearray(path.read_bytes())
    signed = sum(b - 256 if b > 127 else b for b in data[:148] + data[156:512]) + 256
    data[148:156] = b"%06o\x00 " % signed
    path.write_bytes(bytes(data))
    assert build_shard_index(str(path), tmp_path / "old.idx").meta["samples"] == 1


def test_not_a_tar(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    path.write_bytes(b"")
    assert "empty file" in _index_error(path)
    path.write_bytes(encode() * 3)
    assert "corrupt tar header at byte 0" in _index_error(path)
    path.write_bytes(b"\x1f\x8b\x08" + bytes(2000))
    assert "gzip-compressed" in _index_error(path)


def test_bad_labels_and_duplicate_members(tmp_path: Path) -> None:
    path = tmp_path / "l.tar"
    write_tar(path, [("a.jpg", b"x"), ("a.cls", b"cat")])
    message = _index_error(path)
    assert str(path) in message and "'a.cls'" in message and "not an integer" in message
    write_tar(path, [("a.jpg", b"x"), ("a.JPG", b"y")])
    assert "'a.JPG' appears twice in sample 'a'" in _index_error(path)


def test_index_is_reused_then_rebuilt_when_the_shard_changes(tmp_path: Path) -> None:
    path = tmp_path / "r.tar"
    write_tar(path, [("a.jpg", b"1"), ("b.jpg", b"2")])
    first = load_shard_index(str(path))
    assert first.path == str(tmp_path / "r.tar.fl-idx") and first.meta["samples"] == 2
    before = os.stat(first.path)
    second = load_shard_index(str(path))
    after = os.stat(second.path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "reused, not rewritten"
    write_tar(path, [("a.jpg", b"1"), ("b.jpg", b"2"), ("c.jpg", b"3")])
    os.utime(path, ns=(before.st_mtime_ns + 10**9, before.st_mtime_ns + 10**9))
    assert load_shard_index(str(path)).meta["samples"] == 3
    assert load_shard_index(str(path), image_exts=("png",)).meta["samples"] == 0  # other extensions: rebuilt
    Path(first.path).write_bytes(b"garbage")
    assert load_shard_index(str(path)).meta["samples"] == 3  # an unreadable index is rebuilt


def test_index_path_can_be_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "e.tar"
    write_tar(path, [("a.jpg", b"1")])
    index = load_shard_index(str(path), tmp_path / "elsewhere" / "e.idx")
    assert Path(index.path).is_file() and not (tmp_path / "e.tar.fl-idx").exists()
