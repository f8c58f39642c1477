"""Bad JPEGs are bad whatever the crop, the route or the decoder: truncated files closed by an end marker,
arithmetic-coded files cut short, files of thousands of scans; none handed on to PIL (real files, real decodes).

``data/arithmetic.jpg``: a 160x120 crop of a sample photo, made arithmetic-coded with libjpeg-turbo's
``jpegtran -arithmetic`` (the Debian package libjpeg-turbo-progs; PIL cannot write one).
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fastloader import transforms as T
from fastloader.errors import CorruptJPEGError, DecodeError
from fastloader.image import decode, jpeg_ext
from tests.images import cut, many_scans, photo

pytestmark = pytest.mark.skipif(not jpeg_ext.AVAILABLE, reason="fastloader.image._jpeg not built")

ARITHMETIC = Path(__file__).parent / "data" / "arithmetic.jpg"
TRAIN = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip()])
EXACT_TRAIN = T.Compose([T.RandomResizedCrop(64)], exact_decode=True)
EVAL = T.Compose([T.Resize(72), T.CenterCrop(64)])  # the bottom rows of the image are never in the crop


@pytest.fixture()
def no_pil(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIL's decode must not be reached: it would paper over the damage (or spend seconds on it)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a file the JPEG extension refused reached PIL")

    monkeypatch.setattr(decode, "_decode_with_pil", refuse)


def refused_under_every_crop(data: bytes, key: str, draws: int = 40) -> None:
    torch.manual_seed(0)
    for transform in (TRAIN, EXACT_TRAIN, EVAL):
        for _ in range(draws if transform is not EVAL else 1):
            with pytest.raises(DecodeError, match=re.escape(key)):
                transform.decode_planned(data, key)
    out = np.zeros((4, 64, 64, 3), np.uint8)
    good = photo(200, 150, seed=1)
    for _ in range(draws // 4):  # in a batch of good images: one call of the extension for all
        with pytest.raises(DecodeError, match=re.escape(key)):
            TRAIN.decode_batch([good, data, good, good], out, ["a.jpg", key, "c.jpg", "d.jpg"].__getitem__)


@pytest.mark.parametrize(
    "options", [{}, {"progressive": True}, {"restart_marker_rows": 1}, {"subsampling": 0}], ids=str
)
@pytest.mark.parametrize("fraction", [0.35, 0.6, 0.9])
def test_a_truncated_jpeg_closed_by_an_end_marker_is_refused_whatever_the_crop(
    options: dict[str, Any], fraction: float, no_pil: None
) -> None:
    """Random crops of the top rows alone decode none of the missing rows: the file is refused all the same."""
    refused_under_every_crop(cut(photo(**options), fraction), "n01440764/cut_short.JPEG")


@pytest.mark.parametrize(
    "options",
    [{"subsampling": 2}, {"subsampling": 1}, {"subsampling": 0}, {"progressive": True}, {"restart_marker_rows": 1}],
    ids=str,
)
def test_a_good_file_decodes_under_every_box_scale_and_mode(options: dict[str, Any]) -> None:
    """Entropy-decoding the rows below the box refuses no good file and changes no pixel: every box ending on
    any row (odd ones too: the merged upsampler holds the second row of a pair), at every scale, exact and fast,
    against the full decode of the same mode."""
    data = photo(216, 97, seed=2, **options)
    for scale in jpeg_ext.SCALE_DENOMS:
        for fast in (False, True):
            full = jpeg_ext.decode(data, scale_denom=scale, fast=fast)
            for y0, y1 in [(0, 1), (0, 2), (3, 40), (0, 63), (17, 64), (50, 96), (80, 97), (0, 97)]:
                box = (5 * y0 % 200, y0, 216 - y0 % 7, y1)
                region, (ox, oy) = jpeg_ext.decode_region(data, box, scale, fast)
                np.testing.assert_array_equal(
                    region, full[oy : oy + region.shape[0], ox : ox + region.shape[1]], err_msg=f"{box} {scale} {fast}"
                )


def test_an_arithmetic_coded_jpeg_decodes_and_a_cut_one_is_refused(no_pil: None) -> None:
    data = ARITHMETIC.read_bytes()
    assert data[:2] == b"\xff\xd8" and b"\xff\xc9" in data  # SOF9: sequential, arithmetic-coded
    full = jpeg_ext.decode(data)
    assert full.shape == (120, 160, 3) and full.std() > 20
    region, (ox, oy) = jpeg_ext.decode_region(data, (10, 5, 90, 60))
    np.testing.assert_array_equal(region, full[oy : oy + region.shape[0], ox : ox + region.shape[1]])
    torch.manual_seed(0)
    assert TRAIN.decode_planned(data, "arith.jpg").pixels is not None
    for fraction in (0.3, 0.5, 0.7, 0.9):
        refused_under_every_crop(cut(data, fraction), f"arith_cut_{fraction}.jpg", draws=12)
        with pytest.raises(DecodeError, match="arith_cut"):  # cut without an end marker
            TRAIN.decode_planned(data[: int(len(data) * fraction)], f"arith_cut_{fraction}.jpg")


def test_a_jpeg_of_thousands_of_scans_is_refused_before_decoding_and_never_reaches_pil(no_pil: None) -> None:
    bomb = many_scans(2100)
    assert Image.open(io.BytesIO(bomb)).size == (320, 240)  # what PIL would decode (in 2,110 passes)
    with pytest.raises(CorruptJPEGError, match="more than 500 scans"):
        jpeg_ext.decode(bomb)
    refused_under_every_crop(bomb, "n01440764/many_scans.JPEG", draws=8)
    with pytest.raises(DecodeError, match="many_scans.JPEG.*more than 500 scans"):
        EVAL.decode_planned(bomb, "n01440764/many_scans.JPEG")
    # At the limit it decodes.
    assert jpeg_ext.decode(many_scans(500 - 10)).shape == (240, 320, 3)
