"""PIL in one place: every decode through it converts the same way and names bad data the same way."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastloader.errors import DecodeError
from fastloader.fields.reader import decode_mask
from fastloader.image.pil import decode_pil, to_rgb
from fastloader.pack.readers import ReencodeOptions, reencode


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def test_every_mode_comes_out_rgb() -> None:
    palette = Image.new("P", (4, 4), 1)
    palette.putpalette([0, 0, 0, 200, 10, 20] + [0] * 762)
    palette.info["transparency"] = 0
    for image in (Image.new("L", (4, 4), 90), Image.new("CMYK", (4, 4), (0, 255, 0, 0)), palette):
        rgb = to_rgb(image)
        assert rgb.mode == "RGB" and rgb.size == (4, 4)
    assert decode_pil(encoded(palette)).getpixel((0, 0)) == (200, 10, 20)


def test_an_image_and_a_mask_name_their_key_when_they_do_not_decode() -> None:
    with pytest.raises(DecodeError, match=r"^cats/1\.jpg: cannot decode image \(UnidentifiedImageError"):
        decode_pil(b"not an image", "cats/1.jpg")
    with pytest.raises(DecodeError, match=r"^cats/1\.png: cannot decode the mask \(UnidentifiedImageError"):
        decode_mask(b"not a mask", "cats/1.png")


def test_a_decompression_bomb_is_refused_before_it_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # PIL itself refuses twice that
    data = encoded(Image.new("RGB", (20, 20)))
    for decode in (decode_pil, decode_mask):
        with pytest.raises(DecodeError, match=r"^big\.png: 20x20 = 400 pixels exceeds the limit of 300"):
            decode(data, "big.png")


def test_the_pack_converts_as_the_datasets_decode() -> None:
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 30, 160, 90] + [0] * 762)
    palette.info["transparency"] = 0
    data = encoded(palette)
    packed = reencode(data, ReencodeOptions(quality=95))
    assert np.abs(np.asarray(decode_pil(packed), dtype=int) - np.asarray(decode_pil(data), dtype=int)).max() <= 8


def test_every_broken_byte_of_a_png_is_a_decode_error_naming_the_key() -> None:
    """Each byte of a small PNG set to 0 and to 255 in turn: the image decodes, or the error is our
    DecodeError naming the key (PIL raises SyntaxError for a broken chunk, which once escaped)."""
    out = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), 7, np.uint8)).save(out, format="PNG")
    data, kinds = out.getvalue(), set()
    for offset in range(len(data)):
        for value in (0, 255):
            broken = bytearray(data)
            broken[offset] = value
            try:
                decode_pil(bytes(broken), "shard-3/0007.png")
            except DecodeError as error:
                assert str(error).startswith("shard-3/0007.png: cannot decode image (")
                kinds.add(str(error).split("(")[1].split(":")[0])
    assert "SyntaxError" in kinds
