"""The inputs real datasets contain, mixed into a clean folder, through the datasets, `scan` and `pack`:
0 crashes, every bad input reported with its key, batch sizes exact with "replace"."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as tv
from PIL import Image

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder, LMDBSource
from fastloader.pack import pack
from fastloader.pack.scan import scan
from tests.images import write_image_folder


def jpeg(mode: str = "RGB", **save: object) -> bytes:
    pixels = np.random.default_rng(1).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format="JPEG", quality=90, **save)
    return out.getvalue()


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def png_bomb(width: int = 60000, height: int = 60000) -> bytes:
    """A valid PNG header claiming width x height pixels (10 GB decoded) in a few hundred bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


def jpeg_bomb() -> bytes:
    """A small JPEG whose frame header claims 60000 x 60000 pixels."""
    data = bytearray(jpeg())
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)
    return bytes(data)


def exif_rotated() -> bytes:
    image = Image.new("RGB", (40, 20), (200, 30, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif.tobytes())
    return out.getvalue()


GOOD = {
    "png_rgba.jpg": lambda: png(Image.new("RGBA", (30, 30), (1, 2, 3, 128))),
    "png_palette.jpg": lambda: png(Image.new("RGB", (30, 30), (9, 9, 9)).convert("P")),
    "png_16bit.jpg": lambda: png(Image.fromarray(np.arange(900, dtype=np.uint16).reshape(30, 30))),
    "cmyk.jpg": lambda: jpeg("CMYK"),
    "gray.jpg": lambda: jpeg("L"),
    "progressive.jpg": lambda: jpeg(progressive=True),
    "exif_rotated.jpg": exif_rotated,
}
BAD = {
    "truncated.jpg": lambda: jpeg()[:300],
    "zero_bytes.jpg": lambda: b"",
    "random_bytes.jpg": lambda: np.random.default_rng(2).integers(0, 256, 5000, dtype=np.uint8).tobytes(),
    "not_an_image.jpg": lambda: b"name,label\ncat,1\n",
    "png_bomb.jpg": png_bomb,
    "jpeg_bomb.jpg": jpeg_bomb,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus") / "images"
    write_image_folder(root, count=30)
    for name, make in {**GOOD, **BAD}.items():
        (root / "class_1" / f"odd_{name}").write_bytes(make())
    return root


def bad_keys() -> set[str]:
    return {f"class_1/odd_{name}" for name in BAD}


@pytest.mark.parametrize("fused", [True, False], ids=["fastloader-transforms", "torchvision-transforms"])
def test_replace_survives_every_kind_with_exact_batches(corpus: Path, tmp_path: Path, fused: bool) -> None:
    transform = (
        T.Compose([T.Resize(32), T.CenterCrop(32)])
        if fused
        else tv.Compose([tv.Resize(32), tv.CenterCrop(32), tv.PILToTensor()])
    )
    dataset = ImageFolder(corpus, transform=transform, index_path=tmp_path / "index")
    dataset.set_error_policy("replace", quarantine=tmp_path / "bad.tsv")
    total = 0
    for images, labels in DataLoaderX(dataset, batch_size=8, num_workers=2):
        assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.uint8
        total += len(labels)
    assert total == len(dataset) == 30 + len(GOOD) + len(BAD)
    reported = {line.split("\t")[1] for line in (tmp_path / "bad.tsv").read_text().splitlines()}
    assert reported == bad_keys(), "every bad input reported with its key, and no good one"


def test_scan_and_pack_find_exactly_the_bad_inputs(corpus: Path, tmp_path: Path) -> None:
    report = scan(corpus, report=tmp_path / "scan.tsv", workers=2, progress=False)
    assert {item.key for item in report.bad} == bad_keys()
    summary = pack(str(corpus), tmp_path / "out.lmdb", progress=False, workers=2)
    assert {item.key for item in summary.skipped} == bad_keys() and summary.packed == 30 + len(GOOD)
    assert len(LMDBSource(tmp_path / "out.lmdb")) == 30 + len(GOOD)


def test_bombs_are_refused_before_decoding(tmp_path: Path) -> None:
    from fastloader.errors import DecodeError
    from fastloader.image.pil import decode_pil

    for make in (png_bomb, jpeg_bomb):
        with pytest.raises(DecodeError, match="bomb.jpg: .*exceeds"):
            decode_pil(make(), "bomb.jpg")
        with pytest.raises(DecodeError, match="bomb.jpg"):
            T.Compose([T.Resize(32)]).decode(make(), "bomb.jpg")
