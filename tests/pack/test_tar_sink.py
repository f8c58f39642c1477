"""The tar pack sink: WebDataset-compatible output, and resume after a kill with 0 lost, 0 duplicated."""

from __future__ import annotations

import io
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastloader.datasets.tar import TarShardSource
from fastloader.errors import FormatError, MissingField
from fastloader.fields.source import read_fields
from fastloader.formats.index_file import read_index
from fastloader.formats.tar_manifest import MANIFEST_NAME, PROGRESS_NAME, TarPackState
from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION, build_shard_index
from fastloader.pack.engine import pack
from fastloader.pack.tar_sink import TarShardSink, image_extension
from tests.field_items import FIELDS, LONG_NAME, FieldItems, assert_same_value, field_values

FINGERPRINT = {"source": "/data/train", "options": {"quality": 90, "sizes": (1, 2)}}
REPO = Path(__file__).resolve().parents[2]


def encode(fmt: str, mode: str = "RGB", seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format=fmt)
    return out.getvalue()


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def inputs(count: int) -> list[tuple[str, int, bytes]]:
    """(source key, label, bytes) per source position; every 5th item has no label (-1)."""
    formats = [("JPEG", "RGB"), ("PNG", "RGB"), ("GIF", "RGB"), ("BMP", "RGB"), ("PPM", "RGB"), ("JPEG", "CMYK")]
    return [
        (f"class{i % 3}/img_{i}.x", -1 if i % 5 == 4 else i % 3, encode(*formats[i % len(formats)], seed=i))
        for i in range(count)
    ]


def feed(sink: TarShardSink, items: list[tuple[str, int, bytes]], start: int, stop: int, skip: set[int]) -> None:
    for position in range(start, stop):
        key, label, data = items[position]
        if position in skip:
            sink.add_skipped(position, key, "unreadable")
        else:
            sink.add(position, key, label, data)


def check_output(dst: Path, items: list[tuple[str, int, bytes]], skip: set[int]) -> TarShardSource:
    """Every non-skipped input exactly once, in order, byte-exact, read in random order."""
    source = TarShardSource(dst)
    kept = [position for position in range(len(items)) if position not in skip]
    assert len(source) == len(kept)
    order = list(range(len(source)))
    random.Random(0).shuffle(order)
    for i in order:
        key, label, data = items[kept[i]]
        assert source.read(i) == data and source.label(i) == label and source.source_key(i) == key
    assert [source.source_key(i) for i in range(len(source))] == [items[p][0] for p in kept]
    return source


def test_image_extension_from_magic_bytes() -> None:
    formats = ("JPEG", "PNG", "BMP", "GIF", "TIFF", "PPM")
    assert [image_extension(encode(fmt)) for fmt in formats] == ["jpg", "png", "bmp", "gif", "tiff", "ppm"]
    assert image_extension(encode("PPM", "L")) == "pgm" and image_extension(encode("JPEG", "CMYK")) == "jpg"
    assert image_extension(b"RIFF\x10\x00\x00\x00WEBPVP8 ") == "webp"  # this Pillow build cannot write WebP
    assert image_extension(b"not an image") is None


def test_round_trip_across_shards_is_webdataset_compatible(tmp_path: Path) -> None:
    items, skip = inputs(11), {2, 9}
    dst = tmp_path / "out"
    sink = TarShardSink(dst, FINGERPRINT, shard_size=3)
    assert sink.resume_position() == 0
    feed(sink, items, 0, len(items), skip)
    sink.finish(["class0", "class1", "class2"], {"tool": "test"})
    shards = sorted(p.name for p in dst.glob("*.tar"))
    assert shards == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]  # 3 + 3 + 3 samples
    state = TarPackState.read(dst / MANIFEST_NAME)
    assert state.complete and state.count == 9 and state.position == 11 and state.meta == {"tool": "test"}
    assert [s.position for s in state.skipped] == [2, 9] and not (dst / PROGRESS_NAME).exists()
    # Any tar reader sees {key}.{ext} members with the real format's extension, and .cls text labels.
    with tarfile.open(dst / "shard-000000.tar") as tar:
        names = ["000000000.jpg", "000000000.cls", "000000001.png", "000000001.cls", "000000002.bmp", "000000002.cls"]
        assert tar.getnames() == names
        assert tar.extractfile("000000001.cls").read() == b"1"  # type: ignore[union-attr]
    source = check_output(dst, items, skip)
    assert source.classes == ["class0", "class1", "class2"]
    assert source.key(0) == f"{dst / 'shard-000000.tar'}:000000000" and source.extension(2) == "bmp"
    # The index the sink wrote equals a fresh scan of the shard.
    written = read_index(dst / "shard-000001.tar.fl-idx", INDEX_KIND, INDEX_VERSION)
    rescan = build_shard_index(str(dst / "shard-000001.tar"), tmp_path / "rescan.idx")
    for name in ("key_blob", "key_offsets", "data_offset", "data_size", "ext", "label"):
        assert np.array_equal(written.arrays[name], rescan.arrays[name]), name


def test_first_sample_and_created_make_a_shard_of_a_larger_pack_the_same_bytes_each_time(tmp_path: Path) -> None:
    items = inputs(4)
    for attempt in ("a", "b"):  # a Ray task and its retry (fastloader.pack.ray_shard)
        sink = TarShardSink(tmp_path / attempt, FINGERPRINT, shard_size=10, first_sample=20, created=1_700_000_000)
        feed(sink, items, 0, len(items), {1})
        sink.finish(None, {})
    shard_a, shard_b = (tmp_path / attempt / "shard-000000.tar" for attempt in ("a", "b"))
    assert shard_a.read_bytes() == shard_b.read_bytes()
    with tarfile.open(shard_a) as tar:
        assert tar.getnames()[::2] == ["000000020.jpg", "000000021.gif", "000000022.bmp"]  # numbered from 20
        assert {member.mtime for member in tar.getmembers()} == {1_700_000_000}
    assert TarPackState.read(tmp_path / "a" / MANIFEST_NAME).created == 1_700_000_000


def test_resume_after_abandoning_a_sink_mid_shard(tmp_path: Path) -> None:
    items, skip = inputs(14), {1, 7}
    dst = tmp_path / "out"
    first = TarShardSink(dst, FINGERPRINT, shard_size=4)
    feed(first, items, 0, 11, skip)  # shards end after positions 4 and 9; 10 sits in an open shard
    assert first.resume_position() == 10
    assert list(dst.glob(".shard-000002.tar.partial")), "the open shard is a temporary file"
    del first  # killed: no close, no finish
    with pytest.raises(FormatError, match="incomplete pack"):
        TarShardSource(dst)
    second = TarShardSink(dst, FINGERPRINT, shard_size=4)
    assert second.resume_position() == 10 and not list(dst.glob(".*.partial"))
    assert [s.position for s in second.skipped()] == [1, 7]
    feed(second, items, second.resume_position(), len(items), skip)
    second.finish(None, {})
    check_output(dst, items, skip)


def test_resume_discards_stray_temporaries_and_unrecorded_shards(tmp_path: Path) -> None:
    items = inputs(9)
    dst = tmp_path / "out"
    first = TarShardSink(dst, FINGERPRINT, shard_size=3)
    feed(first, items, 0, 3, set())
    first.close()
    # A run killed while renaming shard 1 (renamed and indexed, not yet recorded), and mid-write.
    (dst / "shard-000001.tar").write_bytes(b"a complete-looking shard nobody recorded")
    (dst / "shard-000001.tar.fl-idx").write_bytes(b"its index")
    (dst / ".shard-000002.tar.partial").write_bytes(b"half a shard")
    (dst / f".{PROGRESS_NAME}.abc123.tmp").write_bytes(b"half a progress file")
    second = TarShardSink(dst, FINGERPRINT, shard_size=3)
    assert second.resume_position() == 3
    assert sorted(p.name for p in dst.iterdir() if "shard" in p.name) == ["shard-000000.tar", "shard-000000.tar.fl-idx"]
    assert not list(dst.glob("*.tmp"))
    feed(second, items, 3, 9, set())
    second.finish(None, {})
    check_output(dst, items, set())


def test_killed_process_resumes_with_nothing_lost_or_duplicated(tmp_path: Path) -> None:
    """A real SIGKILL at an arbitrary point of a running pack."""
    dst, count = tmp_path / "out", 40
    child = f"""
import io, sys, numpy as np
from PIL import Image
from fastloader.pack.tar_sink import TarShardSink
sink = TarShardSink({str(dst)!r}, {{"n": {count}}}, shard_size=3)
for position in range(sink.resume_position(), {count}):
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (position, 0, 0)).save(out, format="PNG")
    sink.add(position, f"k{{position}}", position, out.getvalue())
    print(position, flush=True)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, env=env, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if int(line) >= 20:
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    sink = TarShardSink(dst, {"n": count}, shard_size=3)
    resume = sink.resume_position()
    assert 18 <= resume <= count and resume % 3 == 0  # whole shards only
    for position in range(resume, count):
        out = io.BytesIO()
        Image.new("RGB", (8, 8), (position, 0, 0)).save(out, format="PNG")
        sink.add(position, f"k{position}", position, out.getvalue())
    sink.finish(None, {})
    source = TarShardSource(dst)
    assert [source.source_key(i) for i in range(len(source))] == [f"k{i}" for i in range(count)]
    assert source.labels().tolist() == list(range(count))
    assert [Image.open(io.BytesIO(source.read(i))).getpixel((0, 0))[0] for i in range(count)] == list(range(count))


def test_checkpoint_makes_skips_durable_between_shards(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    items = inputs(4)
    sink = TarShardSink(dst, FINGERPRINT, shard_size=2)
    feed(sink, items, 0, 4, {2, 3})
    sink.checkpoint()
    assert sink.resume_position() == 4
    assert TarShardSink(dst, FINGERPRINT, shard_size=2).resume_position() == 4


def test_finished_pack_reports_done_and_refuses_more(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    items = inputs(2)
    sink = TarShardSink(dst, FINGERPRINT)
    feed(sink, items, 0, 2, set())
    sink.finish(None, {})
    again = TarShardSink(dst, FINGERPRINT)
    assert again.resume_position() == 2
    with pytest.raises(ValueError, match="already finished"):
        again.add(2, "k", 0, items[0][2])
    again.finish(["a"], {})  # finishing again only rewrites the manifest
    assert TarShardSource(dst).classes == ["a"] and len(TarShardSource(dst)) == 2


def test_different_fingerprint_or_foreign_shards_are_refused(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    sink = TarShardSink(dst, FINGERPRINT, shard_size=1)
    feed(sink, inputs(1), 0, 1, set())
    sink.close()
    with pytest.raises(FormatError, match=f"{dst}: holds a different pack"):
        TarShardSink(dst, {**FINGERPRINT, "source": "/data/other"})
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "shard-000000.tar").write_bytes(b"")
    with pytest.raises(FormatError, match="refusing to overwrite"):
        TarShardSink(foreign, FINGERPRINT)


def test_bad_calls_are_refused_without_writing(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    sink = TarShardSink(dst, FINGERPRINT)
    with pytest.raises(ValueError, match="k0: not a known image format"):
        sink.add(0, "k0", 0, b"plain text")
    sink.add_skipped(0, "k0", "not an image")  # the same position may then be skipped
    sink.add(1, "k1", 0, encode("PNG"))
    with pytest.raises(ValueError, match="positions must strictly increase"):
        sink.add(1, "k1", 0, encode("PNG"))
    with pytest.raises(ValueError, match="shard_size"):
        TarShardSink(tmp_path / "x", FINGERPRINT, shard_size=0)
    sink.close()
    with pytest.raises(ValueError, match="closed"):
        sink.finish(None, {})
    assert not list(dst.glob("*.tar")) and not list(dst.glob(".*.partial")), "a closed open shard is discarded"


# -- fields ---------------------------------------------------------------------------------------


def check_fields(source: TarShardSource, items: FieldItems) -> None:
    """Every field of every item back under its original name and kind, exactly; absent ones missing."""
    assert source.field_kinds() == dict(sorted(FIELDS.items()))
    assert len(source) == len(items)
    for i in range(len(source)):
        expected = field_values(i)
        assert read_fields(source, i).keys() == expected.keys()
        for name in FIELDS:
            if name in expected:
                assert_same_value(source.read_field(i, name), expected[name], f"{i} {name}")
            else:
                with pytest.raises(
                    MissingField, match=rf"{re.escape(source.key(i))}: no field {re.escape(repr(name))}"
                ):
                    source.read_field(i, name)


def test_pack_keeps_fields_with_any_name_exactly(tmp_path: Path) -> None:
    items = FieldItems(10)
    pack(items, tmp_path / "out", format="tar", shard_size=4, workers=0, progress=False)
    source = TarShardSource(tmp_path / "out")
    check_fields(source, items)
    assert [source.read(i) for i in range(10)] == [items.read(i) for i in range(10)]
    assert source.labels().tolist() == [i % 3 for i in range(10)]
    # Names a tar extension cannot hold are percent-encoded and lowercased; a kind suffix tells WebDataset
    # readers how to decode; an image extension ("png") is not taken for the sample's image.
    state = TarPackState.read(tmp_path / "out" / MANIFEST_NAME)
    assert {name: (m.kind, m.extension) for name, m in state.fields.items()} == {
        "image/object/bbox/xmin": ("array", "image%2fobject%2fbbox%2fxmin.npy"),
        "TEXT": ("text", "text"),
        "Caption": ("text", "caption.txt"),
        "txt": ("text", "txt"),
        "meta": ("json", "meta.json"),
        "score": ("float", "score"),
        "count": ("int", "count"),
        "raw": ("bytes", "raw"),
        "png": ("image", "field.png"),
        "mask": ("image", "mask"),
        LONG_NAME: ("json", "deeply%2f" * 16 + "nested.json"),
    }
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        names = [name for name in tar.getnames() if name.startswith("000000001.")]
    assert names[:2] == ["000000001.png", "000000001.cls"]  # the image (a PNG: image_bytes(1)), the label
    assert sorted(names[2:]) == sorted(
        [
            "000000001.caption.txt",
            "000000001.count",
            "000000001.field.png",
            "000000001.meta.json",
            "000000001.raw",
            "000000001.score",
            "000000001.text",
            "000000001.txt",
            "000000001." + "deeply%2f" * 16 + "nested.json",
        ]
    )


def test_pack_from_plain_shards_keeps_every_member(tmp_path: Path) -> None:
    """WebDataset shards with fields, packed to tar shards: every member kept, as its extension's kind."""
    shard = tmp_path / "plain.tar"
    members = []
    for i in range(5):
        members += [(f"s{i}.jpg", encode("JPEG", seed=i)), (f"s{i}.cls", str(i).encode())]
        members += [(f"s{i}.txt", f"caption {i}".encode()), (f"s{i}.json", b'{"k": [%d]}' % i)]
        members += [(f"s{i}.seg.png", encode("PNG", "L", seed=i)), (f"s{i}.weird", bytes([i, 0xFE]))]
        if i != 3:
            members.append((f"s{i}.npy", npy(np.arange(i + 1, dtype=np.uint16))))
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    original = TarShardSource(str(shard))
    kinds = {"txt": "text", "json": "json", "seg.png": "image", "weird": "bytes", "npy": "array"}
    assert original.field_kinds() == dict(sorted(kinds.items()))
    pack(str(shard), tmp_path / "out", format="tar", workers=0, progress=False)
    packed = TarShardSource(tmp_path / "out")
    assert packed.field_kinds() == original.field_kinds() and len(packed) == 5
    for i in range(5):
        for name in kinds:
            if i == 3 and name == "npy":
                with pytest.raises(MissingField, match="000000003: no field 'npy'"):
                    packed.read_field(i, name)
                continue
            assert_same_value(packed.read_field(i, name), original.read_field(i, name), f"{i} {name}")
        assert packed.read(i) == original.read(i) and packed.label(i) == i


def test_fields_survive_a_resume_and_a_different_field_set_is_refused(tmp_path: Path) -> None:
    items, dst, kinds = FieldItems(7), tmp_path / "out", dict(FIELDS)
    first = TarShardSink(dst, FINGERPRINT, shard_size=3, fields=kinds)
    for i in range(5):
        first.add(i, items.key(i), items.label(i), items.read(i), field_values(i))
    del first  # killed with shard 1 open
    with pytest.raises(FormatError, match="holds a different pack"):
        TarShardSink(dst, FINGERPRINT, shard_size=3, fields={**kinds, "extra": "text"})
    second = TarShardSink(dst, FINGERPRINT, shard_size=3, fields=kinds)
    assert second.resume_position() == 3
    for i in range(3, 7):
        second.add(i, items.key(i), items.label(i), items.read(i), field_values(i))
    second.finish(None, {})
    check_fields(TarShardSource(dst), items)


def test_fields_that_cannot_be_kept_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"fields 'Caption' and 'caption' would both be stored as tar members '\*\.caption\.txt'"
    ):
        TarShardSink(tmp_path / "a", FINGERPRINT, fields={"Caption": "text", "caption": "text"})
    with pytest.raises(ValueError, match="a field name cannot be empty"):
        TarShardSink(tmp_path / "b", FINGERPRINT, fields={"": "text"})
    with pytest.raises(ValueError, match="kind must be one of"):
        TarShardSink(tmp_path / "c", FINGERPRINT, fields={"x": "pickle"})
    sink = TarShardSink(tmp_path / "d", FINGERPRINT, fields={"meta": "json", "n": "int"})
    with pytest.raises(ValueError, match=r"k0: field 'meta': a object is not a valid json value"):
        sink.add(0, "k0", 0, encode("PNG"), {"n": 1, "meta": object()})
    with pytest.raises(ValueError, match=r"k0: fields \['other'\] were not declared"):
        sink.add(0, "k0", 0, encode("PNG"), {"other": 1})
    sink.add(0, "k0", 0, encode("PNG"), {"n": 5})
    sink.finish(None, {})
    source = TarShardSource(tmp_path / "d")
    assert len(source) == 1 and source.read_field(0, "n") == 5, "the refused adds wrote nothing"
    with pytest.raises(MissingField, match="no field 'meta'"):
        source.read_field(0, "meta")


def test_webdataset_reads_the_fields_of_a_pack(tmp_path: Path) -> None:
    import webdataset as wds

    items = FieldItems(6)
    pack(items, tmp_path / "out", format="tar", shard_size=4, workers=0, progress=False)
    urls = [str(path) for path in sorted((tmp_path / "out").glob("shard-*.tar"))]
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode())
    assert [sample["__key__"] for sample in samples] == [f"{i:09d}" for i in range(6)]
    for i, sample in enumerate(samples):
        expected = field_values(i)
        assert sample["cls"] == i % 3
        assert sample["text"] == expected["TEXT"] and sample["txt"] == expected["txt"]
        assert sample["meta.json"] == expected["meta"] and sample["raw"] == expected["raw"]
        assert sample["field.png"] == expected["png"] and float(sample["score"]) == expected["score"]
        assert int(sample["count"]) == expected["count"]
        assert sample["deeply%2f" * 16 + "nested.json"] == expected[LONG_NAME]
        if "Caption" in expected:
            assert sample["caption.txt"] == expected["Caption"]
        if "mask" in expected:
            array = sample["image%2fobject%2fbbox%2fxmin.npy"]
            assert array.dtype == np.float32 and array.tolist() == expected["image/object/bbox/xmin"].tolist()
            assert sample["mask"] == expected["mask"]
        image_ext = next(ext for ext in ("jpg", "png") if ext in sample)
        assert sample[image_ext] == items.read(i)
