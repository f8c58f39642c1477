"""fastloader.image.jpeg_ext: partial JPEG decoding against PIL (same libjpeg-turbo), errors, threads, leaks."""

from __future__ import annotations

import io
import math
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import PIL
import pytest
from PIL import Image

from fastloader.errors import UnsupportedJPEGError
from fastloader.image import jpeg_ext, pil
from fastloader.sample import PHOTOS
from tests.helpers import run_child
from tests.images import needs_arrow

pytestmark = pytest.mark.skipif(
    not jpeg_ext.AVAILABLE, reason="fastloader.image._jpeg not built (no libjpeg-turbo headers at install time)"
)

# name -> (width, height, PIL save options). PIL subsampling: 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0.
KINDS: dict[str, tuple[int, int, dict]] = {
    "420": (500, 375, {"quality": 90, "subsampling": 2}),
    "422_odd": (333, 257, {"quality": 85, "subsampling": 1}),
    "444_odd": (257, 333, {"quality": 95, "subsampling": 0}),
    "420_progressive": (375, 500, {"quality": 80, "subsampling": 2, "progressive": True}),
    "444_progressive": (301, 203, {"quality": 90, "subsampling": 0, "progressive": True}),
    "420_restart": (333, 257, {"quality": 90, "subsampling": 2, "restart_marker_rows": 1}),
    "420_optimized_tiny": (17, 9, {"quality": 75, "subsampling": 2, "optimize": True}),
    "one_pixel": (1, 1, {"quality": 90}),
    "gray": (333, 257, {"quality": 90, "mode": "L"}),
    "gray_progressive": (200, 123, {"quality": 90, "mode": "L", "progressive": True}),
}


def photo_crop(width: int, height: int, seed: int) -> Image.Image:
    """A crop of a real photo, resized: noise or flat colours would not exercise chroma edges."""
    rng = np.random.default_rng(seed)
    photo = Image.open(sorted(PHOTOS.glob("*.jpg"))[seed % 3]).convert("RGB")
    x, y = int(rng.integers(0, photo.width // 3)), int(rng.integers(0, photo.height // 3))
    return photo.crop((x, y, photo.width - x // 2, photo.height - y // 2)).resize(
        (width, height), Image.Resampling.BICUBIC
    )


def encode(image: Image.Image, **options: object) -> bytes:
    mode = options.pop("mode", None)
    if mode is not None:
        image = image.convert(str(mode))
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def jpegs() -> dict[str, bytes]:
    return {
        name: encode(photo_crop(w, h, seed), **dict(opts)) for seed, (name, (w, h, opts)) in enumerate(KINDS.items())
    }


def pil_decode(data: bytes, scale: int = 1) -> np.ndarray:
    """PIL's decode at 1/scale: draft() selects libjpeg's DCT scaling, as decode(scale_denom=) does."""
    image = Image.open(io.BytesIO(data))
    width, height = image.size
    if scale > 1:
        # Floor: draft picks the largest scale whose image is at least this size.
        image.draft("RGB", (max(1, width // scale), max(1, height // scale)))
    array = np.asarray(image.convert("RGB"))
    assert array.shape == (math.ceil(height / scale), math.ceil(width / scale), 3)
    return array


def random_boxes(width: int, height: int, count: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    boxes = [(0, 0, width, height), (width - 1, height - 1, width, height), (0, 0, 1, 1), (width // 2, 0, width, 1)]
    for _ in range(count):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        boxes.append((x0, y0, int(rng.integers(x0 + 1, width + 1)), int(rng.integers(y0 + 1, height + 1))))
    return boxes


def test_jpeg_info_reads_the_header(jpegs: dict[str, bytes]) -> None:
    for name, (width, height, options) in KINDS.items():
        components = 1 if options.get("mode") == "L" else 3
        assert jpeg_ext.jpeg_info(jpegs[name]) == (width, height, components), name
    cmyk = encode(photo_crop(40, 30, 0).convert("CMYK"), quality=90)
    assert jpeg_ext.jpeg_info(cmyk) == (40, 30, 4)
    for junk in (b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"):
        with pytest.raises(ValueError):
            jpeg_ext.jpeg_info(junk)


@pytest.mark.parametrize("name", list(KINDS))
def test_decode_equals_pil_at_every_scale(jpegs: dict[str, bytes], name: str) -> None:
    for scale in jpeg_ext.SCALE_DENOMS:
        decoded = jpeg_ext.decode(jpegs[name], scale_denom=scale)
        assert decoded.dtype == np.uint8 and decoded.flags.c_contiguous and decoded.flags.writeable
        np.testing.assert_array_equal(decoded, pil_decode(jpegs[name], scale), err_msg=f"{name} 1/{scale}")


@pytest.mark.parametrize("name", list(KINDS))
def test_decode_region_equals_the_full_decode_around_the_box(jpegs: dict[str, bytes], name: str) -> None:
    """Every returned pixel, inside the box or in the margin, equals the full decode; the box is covered."""
    data = jpegs[name]
    width, height, _ = KINDS[name]
    for scale in jpeg_ext.SCALE_DENOMS:
        full = pil_decode(data, scale)
        for box in random_boxes(width, height, 25, seed=scale):
            x0, y0, x1, y1 = box
            region, (ox, oy) = jpeg_ext.decode_region(data, box, scale_denom=scale)
            h, w = region.shape[:2]
            where = f"{name} 1/{scale} box={box} origin={(ox, oy)} shape={region.shape}"
            assert region.flags.c_contiguous, where
            # Whole scaled rows, exactly; columns from an iMCU boundary (at most 2 iMCUs = 32 px early).
            assert oy == y0 // scale and oy + h == math.ceil(y1 / scale), where
            assert x0 // scale - 32 < ox <= x0 // scale and ox + w >= math.ceil(x1 / scale), where
            np.testing.assert_array_equal(region, full[oy : oy + h, ox : ox + w], err_msg=where)


def with_luma_sampling(data: bytes, factors: int) -> bytes:
    """The same JPEG with the luma sampling byte of its SOF patched (PIL writes only 4:4:4/4:2:2/4:2:0).

    With the same blocks per MCU and as many MCUs (dimensions multiples of 32), the entropy data stays
    valid: the pixels are scrambled, but PIL and we must still decode them identically.
    """
    sof = data.index(b"\xff\xc0")
    return data[: sof + 11] + bytes([factors]) + data[sof + 12 :]


@pytest.mark.parametrize(("layout", "subsampling", "factors"), [("4:4:0", 1, 0x12), ("4:1:1", 2, 0x41)])
def test_other_chroma_layouts(layout: str, subsampling: int, factors: int) -> None:
    data = with_luma_sampling(encode(photo_crop(320, 224, 4), quality=90, subsampling=subsampling), factors)
    for scale in jpeg_ext.SCALE_DENOMS:
        full = pil_decode(data, scale)
        np.testing.assert_array_equal(jpeg_ext.decode(data, scale_denom=scale), full, err_msg=layout)
        for box in random_boxes(320, 224, 15, seed=scale):
            region, (ox, oy) = jpeg_ext.decode_region(data, box, scale_denom=scale)
            h, w = region.shape[:2]
            np.testing.assert_array_equal(region, full[oy : oy + h, ox : ox + w], err_msg=f"{layout} {box}")


def test_fast_mode_is_close_and_crops_match_its_full_decode(jpegs: dict[str, bytes]) -> None:
    """fast=True: ifast IDCT + plain upsampling; a few levels off overall, larger only at chroma edges."""
    for name in ("420", "422_odd", "444_odd", "420_progressive", "gray"):
        data = jpegs[name]
        width, height, _ = KINDS[name]
        for scale in (1, 2):
            fast = jpeg_ext.decode(data, scale_denom=scale, fast=True)
            diff = np.abs(fast.astype(np.int16) - pil_decode(data, scale))
            print(f"fast {name} 1/{scale}: max abs diff {diff.max()}, mean {diff.mean():.3f}")
            assert diff.mean() < 2.5 and diff.max() <= 64, name
            for box in random_boxes(width, height, 10, seed=7):
                region, (ox, oy) = jpeg_ext.decode_region(data, box, scale_denom=scale, fast=True)
                h, w = region.shape[:2]
                np.testing.assert_array_equal(region, fast[oy : oy + h, ox : ox + w], err_msg=f"{name} {box}")


def test_cmyk_raises_the_fallback_error() -> None:
    cmyk = encode(photo_crop(64, 48, 1).convert("CMYK"), quality=90)
    with pytest.raises(UnsupportedJPEGError, match="CMYK"):
        jpeg_ext.decode(cmyk)
    with pytest.raises(NotImplementedError):
        jpeg_ext.decode_region(cmyk, (0, 0, 10, 10))


def test_bad_arguments_raise_value_error(jpegs: dict[str, bytes]) -> None:
    data = jpegs["420"]  # 500x375
    for box in [(0, 0, 0, 10), (10, 0, 5, 10), (-1, 0, 10, 10), (0, 0, 501, 10), (0, 0, 10, 376)]:
        with pytest.raises(ValueError, match="box"):
            jpeg_ext.decode_region(data, box)
    with pytest.raises(ValueError, match="scale_denom"):
        jpeg_ext.decode(data, scale_denom=3)
    # Any bytes-like input is accepted.
    np.testing.assert_array_equal(jpeg_ext.decode(bytearray(data)), jpeg_ext.decode(memoryview(data)))


def test_corrupt_inputs_raise_value_error(jpegs: dict[str, bytes]) -> None:
    data, progressive = jpegs["420"], jpegs["420_progressive"]
    png = io.BytesIO()
    photo_crop(32, 32, 0).save(png, "PNG")
    rng = np.random.default_rng(0)
    cases = {
        "zero bytes": b"",
        "png": png.getvalue(),
        "random": rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        "random after SOI": b"\xff\xd8" + bytes(range(256)) * 8,
        "header only": data[:600],
        "truncated 60%": data[: len(data) * 6 // 10],
        "progressive truncated 90%": progressive[: len(progressive) * 9 // 10],
    }
    for what, bad in cases.items():
        with pytest.raises(ValueError) as raised:
            jpeg_ext.decode(bad)
        assert str(raised.value), what
    # Junk after a SOI may hold a marker of a JPEG process libjpeg does not decode (here SOF 0xcb): then
    # the answer is the fallback error, and PIL, falling back, fails on it too.
    with pytest.raises((ValueError, NotImplementedError)):
        jpeg_ext.decode(b"\xff\xd8" + rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    # A truncated file must not yield grey rows, for a region that reaches past the cut too.
    with pytest.raises(ValueError, match="Premature end"):
        jpeg_ext.decode_region(data[: len(data) // 2], (100, 200, 300, 375))


def test_mutated_jpegs_never_crash(jpegs: dict[str, bytes]) -> None:
    """Bit flips and cuts anywhere: pixels or a ValueError / UnsupportedJPEGError, never a crash."""
    rng = np.random.default_rng(1)
    outcomes = {"ok": 0, "error": 0}
    for i in range(300):
        source = bytearray(jpegs[list(KINDS)[i % len(KINDS)]])
        for _ in range(int(rng.integers(1, 6))):
            source[int(rng.integers(0, len(source)))] = int(rng.integers(0, 256))
        if i % 3 == 0:
            source = source[: int(rng.integers(0, len(source)))]
        try:
            if i % 2:
                jpeg_ext.decode(bytes(source), scale_denom=int(rng.choice(jpeg_ext.SCALE_DENOMS)))
            else:
                width, height, _ = jpeg_ext.jpeg_info(bytes(source))
                box = random_boxes(width, height, 1, seed=i)[-1] if width * height else (0, 0, 1, 1)
                if i % 4:
                    jpeg_ext.decode_region(bytes(source), box, fast=bool(i % 8 == 2))
                else:  # the same decode, resized into a slot
                    source_box = (float(box[0]), float(box[1]), float(box[2]), float(box[3]))
                    out = np.empty((int(rng.integers(1, 40)), int(rng.integers(1, 40)), 3), np.uint8)
                    jpeg_ext.decode_resized(bytes(source), box, 1, True, source_box, True, out, bool(i % 3), 1)
            outcomes["ok"] += 1
        except ValueError:  # UnsupportedJPEGError is a NotImplementedError: let it surface if a flip makes one
            outcomes["error"] += 1
        except NotImplementedError:
            outcomes["error"] += 1
    assert outcomes["ok"] and outcomes["error"], outcomes


def with_dimensions(data: bytes, width: int, height: int) -> bytes:
    """The same JPEG with its SOF header patched to claim another size (a decompression bomb)."""
    sof = data.index(b"\xff\xc0")
    return data[: sof + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 9 :]


def test_absurd_dimensions_are_rejected_before_allocating(jpegs: dict[str, bytes]) -> None:
    bomb = with_dimensions(jpegs["420"], 60000, 60000)
    assert jpeg_ext.jpeg_info(bomb)[:2] == (60000, 60000)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with pytest.raises(ValueError, match="exceeds the limit"):
        jpeg_ext.decode(bomb)
    with pytest.raises(ValueError, match="exceeds the limit"):
        jpeg_ext.decode_region(bomb, (0, 0, 10, 10))
    # the 10.8 GB of pixels were never written: the process's peak memory did not grow by a fraction of it
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200 * 1024


def first_scan(data: bytes) -> bytes:
    """The first SOS segment and its entropy-coded data (up to the next marker that is not a restart)."""
    start = data.index(b"\xff\xda")
    end = start + 2 + int.from_bytes(data[start + 2 : start + 4], "big")
    while not (data[end] == 0xFF and data[end + 1] != 0 and not 0xD0 <= data[end + 1] <= 0xD7):
        end += 1
    return data[start:end]


def test_progressive_scan_bombs_are_cut_off() -> None:
    """Thousands of scans make every pass re-walk the coefficients (a DoS); libjpeg alone accepts them."""
    data = encode(photo_crop(64, 48, 0), quality=90, progressive=True)
    # A repeated DC scan is only a warning to libjpeg (PIL decodes it): a few of them still decode.
    scan, eoi = first_scan(data), data.rindex(b"\xff\xd9")
    assert jpeg_ext.decode(data[:eoi] + scan * 10 + data[eoi:]).shape == (48, 64, 3)
    with pytest.raises(ValueError, match="scans"):
        jpeg_ext.decode(data[:eoi] + scan * 600 + data[eoi:])


def test_constants_match_the_extension() -> None:
    from fastloader.image import _jpeg  # type: ignore[attr-defined]

    assert jpeg_ext.MAX_PIXELS == _jpeg.MAX_PIXELS
    assert jpeg_ext.LIBJPEG_TURBO_VERSION == _jpeg.LIBJPEG_TURBO_VERSION >= 1_005_000
    assert jpeg_ext.RESIZE_SIMD == bool(_jpeg.RESIZE_SIMD)
    assert jpeg_ext.MAX_AXIS_WEIGHTS == _jpeg.MAX_AXIS_WEIGHTS


def test_threads_decode_concurrently_and_correctly(jpegs: dict[str, bytes]) -> None:
    names = list(KINDS) * 6
    work = [(jpegs[n], random_boxes(*KINDS[n][:2], 1, seed=i)[-1], (1, 2, 4, 8)[i % 4]) for i, n in enumerate(names)]

    def run(item: tuple[bytes, tuple[int, int, int, int], int]) -> tuple[bytes, tuple[int, int]]:
        region, origin = jpeg_ext.decode_region(item[0], item[1], scale_denom=item[2])
        return region.tobytes(), origin

    expected = [run(item) for item in work]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(run, work)) == expected


def test_the_gil_is_released_while_decoding() -> None:
    """Python in another thread runs during the middle of one long decode (a held GIL would stall it there).

    The middle half of the decode is the test, not the longest pause: a busy machine may pause any thread for a
    while, but it does not keep one off the CPU for the whole middle of a decode this long.
    """
    big = encode(photo_crop(3000, 3000, 2), quality=90, progressive=True)
    assert_python_runs_during(lambda: jpeg_ext.decode(big))


def assert_python_runs_during(call: Callable[[], object]) -> None:
    """``call`` on a thread of its own while this one runs Python: some of it in the middle half of the call."""
    window: list[float] = []

    def timed_call() -> None:
        window.append(time.perf_counter())
        call()
        window.append(time.perf_counter())

    worker = threading.Thread(target=timed_call)
    ticks: list[float] = []
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    begin, end = window
    middle = (begin + (end - begin) / 4, end - (end - begin) / 4)
    assert any(middle[0] < tick < middle[1] for tick in ticks), f"no Python ran in {end - begin:.3f} s of the call"


# Run in a fresh interpreter: in the suite's own process, threads and heaps that earlier tests left behind can
# grow its RSS by megabytes while this runs. A leak grows every round, so the quietest of three rounds counts.
LEAK_CHECK = """
import sys
from pathlib import Path
import numpy as np
from fastloader.image import jpeg_ext

good, truncated, cmyk = (Path(sys.argv[1], name).read_bytes() for name in ("good", "truncated", "cmyk"))

def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

out = np.empty((5, 7, 3), np.uint8)
batch = np.empty((2, 5, 7, 3), np.uint8)

def round_trip(i):
    jpeg_ext.decode_region(good, (i % 17, 0, 17, 9), scale_denom=(1, 2)[i % 2])
    jpeg_ext.decode_resized(good, (0, 0, 17, 9), 1, True, (i % 5 + 0.5, 0.0, 17.0, 9.0), i % 2 == 0, out, True, i % 5)
    job = (good, (0, 0, 17, 9), 1, (0.0, 0.0, 17.0, 9.0), True, 0, (0, 0, 7, 5), False, i % 5)
    jpeg_ext.decode_resized_batch([job, (truncated, *job[1:5], 1, *job[6:])], batch, True)
    for bad in (truncated, cmyk):
        try:
            jpeg_ext.decode(bad)
        except (ValueError, NotImplementedError):
            pass

for i in range(1000):  # warm up allocator pools
    round_trip(i)
growths = []
for _ in range(3):
    before = rss_bytes()
    for i in range(10_000):
        round_trip(i)
    growths.append(rss_bytes() - before)
print(min(growths))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists() or sys.platform != "linux", reason="RSS via /proc")
def test_ten_thousand_decodes_do_not_grow_memory(jpegs: dict[str, bytes], tmp_path: Path) -> None:
    (tmp_path / "good").write_bytes(jpegs["420_optimized_tiny"])
    (tmp_path / "truncated").write_bytes(jpegs["420"][:3000])
    (tmp_path / "cmyk").write_bytes(encode(photo_crop(16, 16, 0).convert("CMYK"), quality=90))
    run = run_child([sys.executable, "-c", LEAK_CHECK, str(tmp_path)])
    assert run.returncode == 0, run.stderr
    growth = int(run.stdout.split()[-1])
    # 1 MiB over 10k round trips is 100 bytes each: a leak of any one allocation per decode shows.
    assert growth < 1024 * 1024, f"RSS grew {growth / 1e6:.1f} MB over 10k decodes, in each of three rounds"


@needs_arrow
@pytest.mark.parametrize("mode", ["RGB", "RGBX"])
@pytest.mark.parametrize("width", [1, 3, 4, 5, 13, 224])
def test_pack_rgb_writes_exactly_its_box_of_the_output_mirrored_on_request(mode: str, width: int) -> None:
    rng = np.random.default_rng(width)
    pixels = rng.integers(0, 256, (7, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    for flip in (False, True):
        out = np.full((9, width + 5, 3), 77, dtype=np.uint8)
        jpeg_ext.pack_rgb(image.__arrow_c_array__(), out[1:8, 2 : 2 + width], flip)
        assert np.array_equal(out[1:8, 2 : 2 + width], pixels[:, ::-1] if flip else pixels)
        out[1:8, 2 : 2 + width] = 77
        assert (out == 77).all()  # not a byte outside the box: the 4-byte stores stop at its edge


@needs_arrow
def test_pack_rgb_refuses_what_it_cannot_pack() -> None:
    image = Image.new("RGB", (4, 3))
    with pytest.raises(ValueError, match="12 pixels"):
        jpeg_ext.pack_rgb(image.__arrow_c_array__(), np.zeros((3, 5, 3), np.uint8))  # a box of another size
    with pytest.raises(ValueError, match="packed pixels"):
        jpeg_ext.pack_rgb(image.__arrow_c_array__(), np.zeros((3, 4, 4), np.uint8)[..., :3])  # pixels 4 bytes apart
    with pytest.raises(ValueError, match="4-byte pixels"):
        jpeg_ext.pack_rgb(Image.new("L", (4, 3)).__arrow_c_array__(), np.zeros((3, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        jpeg_ext.pack_rgb(image.__arrow_c_array__(), np.frombuffer(bytes(36), np.uint8).reshape(3, 4, 3))


# decode_resized: PIL's filters by jpeg_ext's codes, and the cases of the comparisons below.
RESAMPLERS = {
    0: Image.Resampling.BOX,
    1: Image.Resampling.BILINEAR,
    2: Image.Resampling.HAMMING,
    3: Image.Resampling.BICUBIC,
    4: Image.Resampling.LANCZOS,
}
Source = tuple[float, float, float, float]
# How far the resize may be from the installed PIL's: Pillow-SIMD (versioned X.Y.Z.postN) keeps 16-bit
# weights with the fractional bits the extension gives them, its pixels exactly; Pillow's 22-bit weights
# leave its pixels within two levels. The pass order is the installed PIL's either way.
PILLOW_SIMD = ".post" in PIL.__version__
LEVELS_OFF = 0 if PILLOW_SIMD else 2


def resize_cases(
    width: int, height: int, seed: int
) -> list[tuple[tuple[int, int, int, int], int, Source, bool, int, int]]:
    """(decode box, scale, source box, crop, out width, out height): whole images, whole-pixel crops
    (crop then resize) and fractional boxes with a margin decoded around them, up and down, at 1/1 and 1/2."""
    rng = np.random.default_rng(seed)
    cases = [((0, 0, width, height), 1, (0.0, 0.0, float(width), float(height)), True, 1 + width // 2, 1 + height // 3)]
    for _ in range(6):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = int(rng.integers(x0 + 1, width + 1)), int(rng.integers(y0 + 1, height + 1))
        out_w, out_h = int(rng.integers(1, 2 * (x1 - x0) + 3)), int(rng.integers(1, 2 * (y1 - y0) + 3))
        cases.append(((x0, y0, x1, y1), 1, (float(x0), float(y0), float(x1), float(y1)), True, out_w, out_h))
        fx0, fy0 = x0 + (x1 - x0) * float(rng.uniform(0, 0.45)), y0 + (y1 - y0) * float(rng.uniform(0, 0.45))
        fx1, fy1 = x1 - (x1 - x0) * float(rng.uniform(0, 0.45)), y1 - (y1 - y0) * float(rng.uniform(0, 0.45))
        margin = (max(0, x0 - 8), max(0, y0 - 8), min(width, x1 + 8), min(height, y1 + 8))
        cases.append((margin, 1, (fx0, fy0, fx1, fy1), False, out_w, out_h))
        if width >= 4 and height >= 4:
            half = (fx0 / 2, fy0 / 2, fx1 / 2, fy1 / 2)
            cases.append(((0, 0, width, height), 2, half, False, max(1, out_w // 2), max(1, out_h // 2)))
    return cases


def pil_resized(data: bytes, case: tuple, filter_code: int, flip: bool) -> np.ndarray:
    """What decode.py's PIL path makes of the same decoded region: PIL's crop + resize or resize with a box."""
    box, scale, source, crop, out_w, out_h = case
    region, (ox, oy) = jpeg_ext.decode_region(data, box, scale, fast=True, rgbx=True)
    image = Image.frombuffer("RGBX", (region.shape[1], region.shape[0]), region, "raw", "RGBX", 0, 1)
    relative = (source[0] - ox, source[1] - oy, source[2] - ox, source[3] - oy)
    if crop:
        resized = image.crop(tuple(round(v) for v in relative)).resize((out_w, out_h), RESAMPLERS[filter_code])
    else:
        resized = image.resize((out_w, out_h), RESAMPLERS[filter_code], box=relative)
    pixels = np.asarray(resized.convert("RGB"))
    return pixels[:, ::-1] if flip else pixels


def our_resized(data: bytes, case: tuple, filter_code: int, flip: bool) -> np.ndarray:
    box, scale, source, crop, out_w, out_h = case
    out = np.empty((out_h, out_w, 3), np.uint8)
    jpeg_ext.decode_resized(data, box, scale, True, source, crop, out, flip, filter_code)
    return out


@pytest.mark.parametrize("filter_code", list(RESAMPLERS))
def test_decode_resized_gives_pils_resize_of_the_region(jpegs: dict[str, bytes], filter_code: int) -> None:
    """PIL's weights and 8-bit passes in PIL's order, with 16-bit weights as Pillow-SIMD keeps them: Pillow-SIMD's
    pixels, Pillow's within two levels and hardly any off at all (a mean of hundredths of a level)."""
    total, count = 0, 0
    for name in ["420", "422_odd", "444_odd", "420_optimized_tiny", "one_pixel", "gray"]:
        for i, case in enumerate(resize_cases(*KINDS[name][:2], seed=filter_code)):
            flip = i % 2 == 1
            ours = our_resized(jpegs[name], case, filter_code, flip).astype(int)
            diff = np.abs(ours - pil_resized(jpegs[name], case, filter_code, flip))
            assert diff.max() <= LEVELS_OFF, (name, case, flip)
            total, count = total + int(diff.sum()), count + diff.size
    assert total / count < 0.02


@pytest.fixture(scope="module")
def edges() -> bytes:
    """Blocks of random colours, hard-edged: the filters overshoot and the passes clip, where a pass order
    that is not PIL's shows (by tens of levels, bicubic and Lanczos)."""
    blocks = np.random.default_rng(7).integers(0, 256, (40, 55, 3), dtype=np.uint8)
    return encode(Image.fromarray(np.repeat(np.repeat(blocks, 5, 0), 6, 1)), quality=95, subsampling=0)


def random_crops(width: int, height: int, count: int, rng: np.random.Generator) -> list[tuple]:
    """``count`` resize cases of a whole-image decode: crops and fractional boxes of every shape, at 1/1 and 1/2,
    to sizes up to twice theirs, to a few pixels (reductions of up to hundreds of times) and to any size."""
    cases = []
    for i in range(count):
        scale = 2 if i % 4 == 3 else 1
        w, h = -(-width // scale), -(-height // scale)
        x0, y0 = int(rng.integers(0, w - 1)), int(rng.integers(0, h - 1))
        x1, y1 = int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))
        limits = [(2 * (x1 - x0) + 3, 2 * (y1 - y0) + 3), (9, 9), (300, 300)][i % 3]
        out_w, out_h = int(rng.integers(1, limits[0])), int(rng.integers(1, limits[1]))
        source: Source = (float(x0), float(y0), float(x1), float(y1))
        crop = i % 2 == 0
        if not crop:
            shrink = rng.uniform(0, 0.45, 4) * [x1 - x0, y1 - y0, x0 - x1, y0 - y1]
            source = tuple(float(v) for v in np.asarray(source) + shrink)  # type: ignore[assignment]
        cases.append(((0, 0, width, height), scale, source, crop, out_w, out_h))
    return cases


@pytest.mark.parametrize("filter_code", list(RESAMPLERS))
def test_decode_resized_matches_pil_over_random_crops_and_sizes(
    jpegs: dict[str, bytes], edges: bytes, filter_code: int
) -> None:
    """Hundreds of random crops and boxes per filter, each resized by the extension and by the installed PIL
    from the same decoded pixels: no pixel further apart than LEVELS_OFF (0 for Pillow-SIMD: its pixels)."""
    images = {name: jpegs[name] for name in ("420", "422_odd", "420_progressive", "gray")} | {"edges": edges}
    rng = np.random.default_rng(100 + filter_code)
    worst: dict[str, int] = {}
    for name, data in images.items():
        width, height, _ = jpeg_ext.jpeg_info(data)
        for i, case in enumerate(random_crops(width, height, 40, rng)):
            diff = np.abs(
                our_resized(data, case, filter_code, i % 5 == 0).astype(int)
                - pil_resized(data, case, filter_code, i % 5 == 0)
            )
            worst[name] = max(worst.get(name, 0), int(diff.max()))
    assert max(worst.values()) <= LEVELS_OFF, (PIL.__version__, worst)


def composed(image: Image.Image, out_w: int, out_h: int, code: int, box: Source, vertical_first: bool) -> np.ndarray:
    """PIL's two passes one at a time (a resize of one side runs that pass alone), in the order asked."""
    width, height, f = image.width, image.height, RESAMPLERS[code]
    if vertical_first:
        tall = image.resize((width, out_h), f, box=(0, box[1], width, box[3]))
        result = tall.resize((out_w, out_h), f, box=(box[0], 0, box[2], out_h))
    else:
        wide = image.resize((out_w, height), f, box=(box[0], 0, box[2], height))
        result = wide.resize((out_w, out_h), f, box=(0, box[1], out_w, box[3]))
    return np.asarray(result.convert("RGB"))


def pillow_13_runs_vertical_first(width: int, height: int, out_w: int, out_h: int) -> bool:
    """Pillow 13's order: the vertical pass first when the height loses more pixels than twice the width."""
    return height - out_h > 0 and height - out_h > 2 * (width - out_w)


def test_the_vertical_pass_runs_first_where_pillow_13_runs_it(jpegs: dict[str, bytes], edges: bytes) -> None:
    """In Pillow 13's order the extension runs the vertical pass first where Pillow 13 does (the size of the image
    it is given decides, not the box's): the pixels of PIL's two passes composed in that order, whatever PIL is
    installed. The orders differ in many of these cases (the test would see a wrong one)."""
    previous = jpeg_ext.set_pass_order(pil.PILLOW_13)
    rng, differing = np.random.default_rng(5), 0
    try:
        for data in (edges, jpegs["422_odd"]):
            width, height, _ = jpeg_ext.jpeg_info(data)
            region, _ = jpeg_ext.decode_region(data, (0, 0, width, height), 1, fast=True, rgbx=True)
            whole = Image.frombuffer("RGBX", (width, height), region, "raw", "RGBX", 0, 1)
            for case in random_crops(width, height, 60, rng):
                box, scale, source, crop, out_w, out_h = case
                if scale != 1:
                    continue
                image = whole.crop(tuple(round(v) for v in source)) if crop else whole
                relative = (0.0, 0.0, float(image.width), float(image.height)) if crop else source
                first = pillow_13_runs_vertical_first(image.width, image.height, out_w, out_h)
                for code in (3, 4):
                    expected = composed(image, out_w, out_h, code, relative, first)
                    other = composed(image, out_w, out_h, code, relative, not first)
                    differing += first and not np.array_equal(expected, other)
                    diff = np.abs(our_resized(data, case, code, False).astype(int) - expected)
                    assert diff.max() <= LEVELS_OFF, (case, code, first)
    finally:
        jpeg_ext.set_pass_order(previous)
    assert differing >= 10


def test_the_pass_order_followed_is_the_one_pil_runs(edges: bytes) -> None:
    """pil.resize_pass_order names what the installed PIL does: its resize is its passes composed in that order
    where they differ, Pillow 13's rule choosing or not (Pillow-SIMD and older Pillows: horizontal first)."""
    order = pil.resize_pass_order()
    assert order in jpeg_ext.PASS_ORDERS
    width, height, _ = jpeg_ext.jpeg_info(edges)
    region, _ = jpeg_ext.decode_region(edges, (0, 0, width, height), 1, fast=True, rgbx=True)
    image = Image.frombuffer("RGBX", (width, height), region, "raw", "RGBX", 0, 1).convert("RGB")
    box = (0.0, 0.0, float(width), float(height))
    seen = set()
    for out_w, out_h in [(400, 60), (300, 20), (20, 300), (100, 150), (330, 150), (60, 30)]:
        first = order == pil.PILLOW_13 and pillow_13_runs_vertical_first(width, height, out_w, out_h)
        resized = np.asarray(image.resize((out_w, out_h), Image.Resampling.LANCZOS))
        assert np.array_equal(resized, composed(image, out_w, out_h, 4, box, first)), (order, out_w, out_h)
        seen.add(pillow_13_runs_vertical_first(width, height, out_w, out_h))
    assert seen == {True, False}  # cases on both sides of Pillow 13's rule
    jpeg_ext.decode_resized(edges, (0, 0, width, height), 1, True, box, False, np.empty((4, 4, 3), np.uint8), False, 1)
    assert jpeg_ext.set_pass_order(order) == order  # the first resize set the installed PIL's


def test_decode_resized_mirrors_exactly_and_writes_only_its_target(jpegs: dict[str, bytes]) -> None:
    data = jpegs["420"]
    for out_w, out_h in [(1, 1), (3, 2), (4, 5), (5, 7), (13, 1), (33, 31), (224, 224)]:
        case = ((40, 30, 300, 200), 1, (41.5, 30.25, 299.0, 199.5), False, out_w, out_h)
        plain = our_resized(data, case, 1, False)
        batch = np.full((3, out_h + 2, out_w + 5, 3), 77, np.uint8)
        jpeg_ext.decode_resized(data, case[0], 1, True, case[2], False, batch[1, 1 : out_h + 1, 2 : out_w + 2], True, 1)
        assert np.array_equal(batch[1, 1 : out_h + 1, 2 : out_w + 2], plain[:, ::-1])
        batch[1, 1 : out_h + 1, 2 : out_w + 2] = 77
        assert (batch == 77).all(), (out_w, out_h)  # not a byte outside the target, in its row or the next


def test_plans_kept_between_resizes_give_the_pixels_of_a_fresh_plan(jpegs: dict[str, bytes]) -> None:
    """A thread keeps the axes it planned last (a batch of one size plans each once). Cycling through more
    sizes and boxes than it keeps, with axes shared between cases in both directions, every resize must give
    what a thread that has planned nothing before gives."""
    data = jpegs["420"]
    cases = [
        ((0, 0, 500, 375), 1, (x0, y0, x0 + side, y0 + side * 0.75), False, out, out)
        for x0, y0 in [(0.0, 0.0), (10.5, 4.25), (100.0, 50.0)]
        for side in (120.0, 300.0, 399.0)
        for out in (224, 97)
    ]
    cases += [((0, 0, 500, 375), 1, (10.5, 10.5, 130.5, 130.5), False, 224, 224)]  # x's axis is y's

    def fresh(case: tuple, code: int, flip: bool) -> bytes:
        result: list[bytes] = []
        thread = threading.Thread(target=lambda: result.append(our_resized(data, case, code, flip).tobytes()))
        thread.start()
        thread.join()
        return result[0]

    expected = {(i, code): fresh(case, code, i % 2 == 1) for i, case in enumerate(cases) for code in (1, 3)}
    for _ in range(3):
        for i, case in enumerate(cases):
            for code in (1, 3):
                assert our_resized(data, case, code, i % 2 == 1).tobytes() == expected[(i, code)], (case, code)


SIMD_CHECK = """
import sys
import numpy as np
from fastloader.image import _jpeg, jpeg_ext
data = open(sys.argv[1], "rb").read()
width, height, _ = jpeg_ext.jpeg_info(data)
outs = []
for order in jpeg_ext.PASS_ORDERS:  # the sizes below run the vertical pass first in Pillow 13's order
    jpeg_ext.set_pass_order(order)
    for code in range(5):
        for out_w, out_h in [(1, 1), (7, 5), (37, 29), (224, 224), (40, 300), (300, 40), (150, 21)]:
            for crop, source in [(True, (3, 2, width - 1, height - 2)), (False, (3.3, 2.7, width - 1.2, height - 2.5))]:
                out = np.empty((out_h, out_w, 3), np.uint8)
                jpeg_ext.decode_resized(data, (0, 0, width, height), 1, True, source, crop, out, code % 2 == 1, code)
                outs.append(out.tobytes())
print(_jpeg.RESIZE_SIMD)
sys.stdout.flush()
open(sys.argv[2], "wb").write(b"".join(outs))
"""


def test_the_vector_and_plain_resize_give_the_same_integers(jpegs: dict[str, bytes], tmp_path: Path) -> None:
    from fastloader.image import _jpeg

    if not _jpeg.RESIZE_SIMD:
        pytest.skip("no AVX2 on this CPU: only the plain C resize runs")
    (tmp_path / "in.jpg").write_bytes(jpegs["422_odd"])
    runs = {}
    for name, env in (("simd", {}), ("plain", {"FASTLOADER_NO_SIMD_RESIZE": "1"})):
        run = run_child(
            [sys.executable, "-c", SIMD_CHECK, str(tmp_path / "in.jpg"), str(tmp_path / name)],
            env={**os.environ, **env},
        )
        assert run.returncode == 0, run.stderr
        runs[name] = (run.stdout.split()[-1], (tmp_path / name).read_bytes())
    assert runs["simd"][0] == "1" and runs["plain"][0] == "0"  # each ran the passes it was meant to
    assert runs["simd"][1] == runs["plain"][1]


def test_decode_resized_refuses_bad_data_and_bad_targets(jpegs: dict[str, bytes]) -> None:
    from fastloader.errors import CorruptJPEGError

    data, whole = jpegs["420"], (0.0, 0.0, 500.0, 375.0)
    out = np.empty((8, 8, 3), np.uint8)
    with pytest.raises(CorruptJPEGError):
        jpeg_ext.decode_resized(data[:3000], (0, 0, 500, 375), 1, True, whole, True, out, False, 1)
    with pytest.raises(UnsupportedJPEGError):
        cmyk = encode(photo_crop(40, 30, 0).convert("CMYK"), quality=90)
        jpeg_ext.decode_resized(cmyk, (0, 0, 40, 30), 1, True, (0.0, 0.0, 40.0, 30.0), True, out, False, 1)
    with pytest.raises(ValueError, match="packed pixels"):
        jpeg_ext.decode_resized(
            data, (0, 0, 500, 375), 1, True, whole, True, np.empty((8, 8, 4), np.uint8)[..., :3], False, 1
        )
    with pytest.raises(ValueError, match="read-only"):
        jpeg_ext.decode_resized(
            data, (0, 0, 500, 375), 1, True, whole, True, np.frombuffer(bytes(192), np.uint8).reshape(8, 8, 3), False, 1
        )
    with pytest.raises(ValueError, match="filter"):
        jpeg_ext.decode_resized(data, (0, 0, 500, 375), 1, True, whole, True, out, False, 5)
    # The rows decoded do not reach the box: a planning bug, said loudly, with both boxes.
    with pytest.raises(RuntimeError, match=r"box \(0, 0, 100, 100\) miss \(50, 50, 200, 200\)"):
        jpeg_ext.decode_resized(data, (0, 0, 100, 100), 1, True, (50.0, 50.0, 200.0, 200.0), False, out, False, 1)


def test_threads_resize_concurrently_and_correctly(jpegs: dict[str, bytes]) -> None:
    work = [(name, case) for name in ("420", "444_odd", "gray") for case in resize_cases(*KINDS[name][:2], seed=3)]

    def run(item: tuple[str, tuple]) -> bytes:
        return our_resized(jpegs[item[0]], item[1], 3, False).tobytes()

    expected = [run(item) for item in work]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(run, work * 3)) == expected * 3


def test_decode_resized_batch_gives_each_jobs_decode_resized_in_its_slot(jpegs: dict[str, bytes]) -> None:
    """One call for many images: each slot holds what decode_resized makes of its job, at its rectangle (the
    rest of the slot untouched), whatever the kinds, scales, filters, flips and rectangles of its neighbours."""
    out_h, out_w = 40, 48
    jobs, expected = [], []
    for name in ["420", "422_odd", "444_progressive", "420_restart", "gray", "one_pixel"]:
        for case in resize_cases(*KINDS[name][:2], seed=len(jobs))[:4]:
            box, scale, source, crop, width, height = case
            width, height = min(width, out_w - 3), min(height, out_h - 2)
            slot, code, flip = len(jobs), len(jobs) % 5, len(jobs) % 3 == 0
            rect = (3, 2, 3 + width, 2 + height)
            jobs.append((jpegs[name], box, scale, source, crop, slot, rect, flip, code))
            alone = np.full((out_h, out_w, 3), 9, np.uint8)
            jpeg_ext.decode_resized(
                jpegs[name], box, scale, True, source, crop, alone[2 : 2 + height, 3 : 3 + width], flip, code
            )
            expected.append(alone)
    out = np.full((len(jobs), out_h, out_w, 3), 9, np.uint8)
    assert jpeg_ext.decode_resized_batch(jobs, out, True) == []
    assert all(np.array_equal(out[i], expected[i]) for i in range(len(jobs)))
    assert jpeg_ext.decode_resized_batch([], out, True) == []


def test_decode_resized_batch_reports_the_jobs_it_refuses_and_decodes_the_others(jpegs: dict[str, bytes]) -> None:
    from fastloader.errors import CorruptJPEGError

    good, whole = jpegs["420"], (0.0, 0.0, 500.0, 375.0)
    cmyk = encode(photo_crop(40, 30, 0).convert("CMYK"), quality=90)

    def job(data: bytes, slot: int, box: tuple[int, int, int, int] = (0, 0, 500, 375)) -> tuple:
        source = (0.0, 0.0, float(box[2]), float(box[3]))
        return (data, box, 1, source, True, slot, (0, 0, 16, 12), False, 1)

    jobs = [job(good, 0), job(good[:3000], 1), job(cmyk, 2, (0, 0, 40, 30)), job(b"not a jpeg", 3), job(good, 4)]
    out = np.zeros((5, 12, 16, 3), np.uint8)
    refused = jpeg_ext.decode_resized_batch(jobs, out, True)
    assert [position for position, _ in refused] == [1, 2, 3]
    assert [type(error) for _, error in refused] == [CorruptJPEGError, UnsupportedJPEGError, CorruptJPEGError]
    assert "SOI" in str(refused[2][1])
    alone = np.empty((12, 16, 3), np.uint8)
    jpeg_ext.decode_resized(good, (0, 0, 500, 375), 1, True, whole, True, alone, False, 1)
    assert np.array_equal(out[0], alone) and np.array_equal(out[4], alone)


def test_decode_resized_batch_refuses_bad_jobs_and_planning_bugs(jpegs: dict[str, bytes]) -> None:
    data = jpegs["420"]
    whole = (0.0, 0.0, 500.0, 375.0)
    out = np.zeros((2, 8, 8, 3), np.uint8)

    def job(**change: object) -> tuple:
        fields = {"box": (0, 0, 500, 375), "source": whole, "slot": 0, "rect": (0, 0, 8, 8), "filter": 1}
        fields.update(change)
        return (data, fields["box"], 1, fields["source"], True, fields["slot"], fields["rect"], False, fields["filter"])

    for bad, match in [
        (job(slot=2), "slot 2"),
        (job(rect=(0, 0, 9, 8)), "rectangle"),
        (job(rect=(4, 0, 4, 8)), "rectangle"),
        (job(filter=7), "filter"),
    ]:
        with pytest.raises(ValueError, match=match):
            jpeg_ext.decode_resized_batch([job(), bad], out, True)
    with pytest.raises(TypeError):
        jpeg_ext.decode_resized_batch([job(), ["not", "a", "tuple"]], out, True)
    with pytest.raises(ValueError, match="packed pixels"):
        jpeg_ext.decode_resized_batch([job()], np.zeros((8, 8, 3), np.uint8), True)
    # Rows that do not reach a job's box: a planning bug ends the batch loudly, whatever its position.
    with pytest.raises(RuntimeError, match=r"box \(0, 0, 100, 100\) miss"):
        jpeg_ext.decode_resized_batch(
            [job(), job(slot=1, box=(0, 0, 100, 100), source=(50.0, 50.0, 200.0, 200.0))], out, True
        )


EMPTYING_JOB = """
import sys
import numpy as np
from fastloader.image import jpeg_ext

data, field = open(sys.argv[1], "rb").read(), sys.argv[2]
jobs = []


class Empties:
    # The parser reads it as an int or a float, and it empties the caller's job list as it is read.
    def __init__(self, value):
        self.value = value

    def __index__(self):
        jobs.clear()
        return int(self.value)

    def __float__(self):
        jobs.clear()
        return float(self.value)


for i in range(4):  # the list holds the only reference to each job
    slot = Empties(i) if field == "slot" and i == 1 else i
    x0 = Empties(0.0) if field == "source" and i == 1 else 0.0
    jobs.append((bytes(data), (0, 0, 500, 375), 1, (x0, 0.0, 500.0, 375.0), False, slot, (0, 0, 16, 12), False, 3))
out = np.zeros((4, 12, 16, 3), np.uint8)
alone = np.zeros((12, 16, 3), np.uint8)
jpeg_ext.decode_resized(data, (0, 0, 500, 375), 1, True, (0.0, 0.0, 500.0, 375.0), False, alone, False, 3)
print(jpeg_ext.decode_resized_batch(jobs, out, True), len(jobs), [bool(np.array_equal(o, alone)) for o in out])
"""


@pytest.mark.parametrize("field", ["slot", "source"])
def test_a_job_that_empties_the_job_list_as_it_is_read_decodes_as_given(
    jpegs: dict[str, bytes], tmp_path: Path, field: str
) -> None:
    """A job's slot (``__index__``) or source (``__float__``) that empties the caller's list while the batch is
    parsed: the batch decodes the jobs it was given, every one (once, this crashed the interpreter). In a
    subprocess, so that a crash fails this test, not the run."""
    (tmp_path / "in.jpg").write_bytes(jpegs["420"])
    run = run_child([sys.executable, "-c", EMPTYING_JOB, str(tmp_path / "in.jpg"), field])
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.split("\n")[0] == "[] 0 [True, True, True, True]"


def test_a_source_or_output_past_any_image_is_a_value_error(jpegs: dict[str, bytes]) -> None:
    """A box past the longest side of any JPEG, an output whose filter weights pass the extension's limit (the
    plan of either ran out of memory, or overflowed and went through), a box that is not one: ValueError
    naming the box and the limit, before any decode."""
    data, limit = jpegs["420"], jpeg_ext.MAX_AXIS_WEIGHTS
    out = np.zeros((2, 8, 8, 3), np.uint8)
    good = (data, (0, 0, 500, 375), 1, (0.0, 0.0, 500.0, 375.0), False, 0, (0, 0, 8, 8), False, 4)
    for source in [(0.0, 0.0, 1e8, 375.0), (0.0, 0.0, 500.0, 1e12), (3e5, 0.0, 3e5 + 10, 375.0)]:
        for crop in (False, True):
            message = r"source \([0-9e.+, ]+\) reaches past 65536 pixels, the longest side of any JPEG"
            with pytest.raises(ValueError, match="decode_resized: " + message):
                jpeg_ext.decode_resized(data, (0, 0, 500, 375), 1, True, source, crop, out[0], False, 4)
            bad = (data, (0, 0, 500, 375), 1, source, crop, 1, (0, 0, 8, 8), False, 4)
            with pytest.raises(ValueError, match="decode_resized_batch: job 1: " + message):
                jpeg_ext.decode_resized_batch([good, bad], out, True)
    # 500 columns to 600,000 by Lanczos: 7 weights each, past the limit of an axis (an image's need far fewer:
    # a 65,536-px side to 1 px takes 393,217).
    wide = np.zeros((1, 600_000, 3), np.uint8)
    message = rf"source \(0, 0, 500, 375\) resized to 600000x1 takes more than {limit} filter weights along x"
    with pytest.raises(ValueError, match="decode_resized: " + message):
        jpeg_ext.decode_resized(data, (0, 0, 500, 375), 1, True, good[3], False, wide, False, 4)
    with pytest.raises(ValueError, match="job 0: " + message):
        jpeg_ext.decode_resized_batch([(*good[:6], (0, 0, 600_000, 1), False, 4)], wide[None], True)
    assert 2 * math.ceil(3 * 65536) + 1 < limit
    for source in [(0.0, 0.0, float("nan"), 375.0), (0.0, float("-inf"), 500.0, 375.0), (5.0, 0.0, 5.0, 375.0)]:
        with pytest.raises(ValueError, match=r"source \(.*\) is not a box"):
            jpeg_ext.decode_resized(data, (0, 0, 500, 375), 1, True, source, False, out[0], False, 1)
        with pytest.raises(ValueError, match=r"job 0: source \(.*\) is not a box"):
            jpeg_ext.decode_resized_batch([(data, *good[1:3], source, *good[4:])], out, True)


def test_decode_resized_batch_releases_the_gil_for_the_whole_batch(jpegs: dict[str, bytes]) -> None:
    """Python in another thread runs in the middle half of a long batch (as for one decode, above)."""
    data = jpegs["420"]
    jobs = [
        (data, (0, 0, 500, 375), 1, (0.0, 0.0, 500.0, 375.0), True, i, (0, 0, 64, 64), False, 3) for i in range(400)
    ]
    out = np.zeros((400, 64, 64, 3), np.uint8)
    assert_python_runs_during(lambda: jpeg_ext.decode_resized_batch(jobs, out, True))


def test_decode_resized_batch_on_threads_gives_the_same_pixels_and_refusals(jpegs: dict[str, bytes]) -> None:
    names = ["420", "422_odd", "444_progressive", "gray", "420_restart"]
    whole = {name: (0.0, 0.0, float(KINDS[name][0]), float(KINDS[name][1])) for name in names}
    jobs = []
    for i in range(40):
        name = names[i % len(names)]
        data = jpegs[name][:700] if i % 13 == 5 else jpegs[name]  # a few truncated: refused, whatever thread
        box = (0, 0, KINDS[name][0], KINDS[name][1])
        jobs.append(
            (
                data,
                box,
                1 + i % 2,
                tuple(v / (1 + i % 2) for v in whole[name]),
                False,
                i,
                (0, 0, 30, 20),
                i % 2 == 0,
                i % 5,
            )
        )
    runs = {}
    for threads in (1, 2, 3, jpeg_ext.MAX_THREADS):
        out = np.zeros((40, 20, 30, 3), np.uint8)
        refused = jpeg_ext.decode_resized_batch(jobs, out, True, threads)
        runs[threads] = (out, [(position, type(error)) for position, error in refused])
    assert runs[1][1] and [position for position, _ in runs[1][1]] == [5, 18, 31]
    for threads, (out, refused) in runs.items():
        assert np.array_equal(out, runs[1][0]) and refused == runs[1][1], threads
    with pytest.raises(ValueError, match="threads"):
        jpeg_ext.decode_resized_batch(jobs, runs[1][0], True, jpeg_ext.MAX_THREADS + 1)
    with pytest.raises(ValueError, match="threads"):
        jpeg_ext.decode_resized_batch(jobs, runs[1][0], True, 0)
    bug = (jpegs["420"], (0, 0, 100, 100), 1, (50.0, 50.0, 200.0, 200.0), False, 3, (0, 0, 30, 20), False, 1)
    with pytest.raises(RuntimeError, match="miss"):  # a planning bug ends the batch on any thread
        jpeg_ext.decode_resized_batch(jobs[:3] + [bug] + jobs[4:], runs[1][0], True, 4)
