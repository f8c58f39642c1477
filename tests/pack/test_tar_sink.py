"""The tar pack sink: WebDataset-compatible output, and resume after a kill with 0 lost, 0 duplicated."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastloader.datasets.tar import TarShardSource
from fastloader.errors import FormatError
from fastloader.formats.index_file import read_index
from fastloader.formats.tar_manifest import MANIFEST_NAME, PROGRESS_NAME, TarPackState
from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION, build_shard_index
from fastloader.pack.tar_sink import TarShardSink, image_extension

FINGERPRINT = {"source": "/data/train", "options": {"quality": 90, "sizes": (1, 2)}}
REPO = Path(__file__).resolve().parents[2]


def encode(fmt: str, mode: str = "RGB", seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format=fmt)
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
