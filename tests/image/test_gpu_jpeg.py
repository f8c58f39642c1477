"""GPU decode's JPEG decoder (fastloader.image.gpu_jpeg): torchcodec when it works, torchvision otherwise.

Run here on the CPU: both libraries decode lists of JPEGs on the CPU too, so the choice, the pixels, the
EXIF handling and the bad-file path are checked for real; nvJPEG itself is tested in tests/gpu/.
"""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.errors import DecodeError
from fastloader.image.batching import EncodedImage, collate
from fastloader.image.decode import decode_plan, read_header
from fastloader.image.gpu_decode import GpuDecoder, _raise_if_out_of_memory
from fastloader.image.gpu_jpeg import ENV, _probe_bytes, _probe_problem, blank_exif_orientation, jpeg_decoder
from fastloader.sample import make_sample_folder
from tests.images import image_bytes

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]
ARITHMETIC = Path(__file__).parent / "data" / "arithmetic.jpg"
torchcodec = pytest.importorskip("torchcodec.decoders", reason="torchcodec is not installed")
# The torchvision decoder is the deprecated one: its own warning is expected where we choose it.
uses_torchvision = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def jpeg(image: Image.Image, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, bytes]]:
    """Plain JPEGs of every kind GPU decode takes: the sample's photos, the repo's test images (RGB and
    grey), an arithmetic-coded one, progressive, 4:4:4 and 4:2:0."""
    root = make_sample_folder(tmp_path_factory.mktemp("photos"), 24, num_classes=1)
    files = [(str(path), path.read_bytes()) for path in sorted(root.glob("*/*.jpg"))]
    files += [(f"images/{i}", image_bytes(i)) for i in range(12)]
    files.append((str(ARITHMETIC), ARITHMETIC.read_bytes()))
    photo = Image.open(io.BytesIO(files[0][1])).convert("RGB")
    files += [
        ("progressive", jpeg(photo, progressive=True)),
        ("444", jpeg(photo, subsampling=0)),
        ("420", jpeg(photo, subsampling=2)),
        ("grey", jpeg(photo.convert("L"))),
    ]
    return [(key, data) for key, data in files if read_header(data, key).plain_jpeg]


def items_of(files: list[tuple[str, bytes]], size: int = 48) -> list[EncodedImage]:
    transform = T.Compose([T.Resize(size), T.CenterCrop(size)])
    out = []
    for index, (key, data) in enumerate(files):
        header = read_header(data, key)
        out.append(EncodedImage(data, transform.plan(header.width, header.height), key, header, index))
    return out


def test_torchcodec_is_chosen_when_it_works() -> None:
    decoder = GpuDecoder(CPU)
    assert decoder.jpeg.name == "torchcodec" and str(decoder.jpeg).startswith("torchcodec ")


def test_decoding_with_torchcodec_warns_of_nothing(jpegs: list[tuple[str, bytes]]) -> None:
    # torchvision's decode_jpeg warns that it is deprecated at each call: the suite used to show hundreds.
    decoder = GpuDecoder(CPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        decoder.decode(items_of(jpegs))
    assert decoder.counts.on_gpu == len(jpegs)


def test_torchcodec_decodes_the_pixels_of_torchvision_and_pil(jpegs: list[tuple[str, bytes]]) -> None:
    # Tolerance: at most 1 level per pixel (both are libjpeg-turbo with its default IDCT; here they agree exactly).
    from torchvision.io import ImageReadMode, decode_jpeg

    codec = jpeg_decoder(CPU, "torchcodec")
    for key, data in jpegs:
        got = codec.decode([codec.prepare(data)], CPU)[0]  # type: ignore[list-item]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            vision = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        pil = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
        assert got.dtype == torch.uint8 and got.shape == vision.shape == pil.shape, key
        assert (got.int() - vision.int()).abs().max() <= 1, key
        assert (got.int() - pil.int()).abs().max() <= 1, key


@uses_torchvision
def test_a_batch_decodes_alike_with_either_decoder(jpegs: list[tuple[str, bytes]]) -> None:
    items = items_of(jpegs)
    codec, vision = GpuDecoder(CPU, jpeg="torchcodec"), GpuDecoder(CPU, jpeg="torchvision")
    got, _ = codec.decode(items)
    expected, _ = vision.decode(items)
    assert got.shape == expected.shape == (len(items), 3, 48, 48) and got.dtype == torch.uint8
    assert (got.int() - expected.int()).abs().max() <= 1
    assert codec.counts.on_gpu == vision.counts.on_gpu == len(items)


def oriented(orientation: int) -> bytes:
    """A 40x24 JPEG stored with EXIF orientation ``orientation``: a phone photo, turned or mirrored."""
    pixels = np.random.default_rng(orientation).integers(0, 256, size=(24, 40, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return jpeg(Image.fromarray(pixels), exif=exif.tobytes())


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_exif_orientation_is_not_applied_as_on_the_cpu_path(orientation: int) -> None:
    # torchcodec turns images by their EXIF orientation; the plan was drawn on the stored size and the CPU
    # path never turns: the GPU path must not either (it did: 3x40x24 images, or mirrored ones).
    transform = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip()])
    data = oriented(orientation)
    header = read_header(data, "phone.jpg")
    items = [EncodedImage(data, transform.plan(header.width, header.height), "phone.jpg", header, 0)]
    decoder = GpuDecoder(CPU, jpeg="torchcodec")
    codec = decoder.jpeg
    whole = codec.decode([codec.prepare(data)], CPU)[0]  # type: ignore[list-item]
    pil = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
    assert torch.equal(whole, pil)  # unturned, unmirrored: the stored pixels
    got, bad = decoder.decode(items)
    expected = torch.from_numpy(decode_plan(data, items[0].plan, "phone.jpg")).permute(2, 0, 1)
    assert not bad and decoder.counts.on_gpu == 1
    assert (got[0].float() - expected.float()).abs().mean() < 3.0  # a turned or mirrored crop is > 30


def test_blanking_leaves_the_pixels_and_refuses_a_header_it_cannot_walk() -> None:
    data = oriented(6)
    blanked = bytearray(data)
    assert blank_exif_orientation(blanked) and blanked != bytearray(data)
    assert Image.open(io.BytesIO(bytes(blanked))).getexif().get(0x0112) is None
    assert np.array_equal(np.array(Image.open(io.BytesIO(bytes(blanked)))), np.array(Image.open(io.BytesIO(data))))
    # fill bytes before a marker, a segment running past the end, no scan at all: not walked
    for broken in (data[:2] + b"\xff" + data[2:], data[:4] + b"\xff\xff" + data[6:], data[:200]):
        assert not blank_exif_orientation(bytearray(broken))


def test_a_header_it_cannot_walk_is_decoded_on_the_cpu() -> None:
    data = oriented(6)
    padded = data[:2] + b"\xff" + data[2:]  # a fill byte: legal, but the EXIF blanking does not walk it
    header = read_header(padded, "padded.jpg")
    plan = T.Compose([T.CenterCrop(20)]).plan(header.width, header.height)
    decoder = GpuDecoder(CPU, jpeg="torchcodec")
    got, bad = decoder.decode([EncodedImage(padded, plan, "padded.jpg", header, 0)])
    expected = torch.from_numpy(decode_plan(padded, plan, "padded.jpg")).permute(2, 0, 1)
    assert not bad and torch.equal(got[0], expected)
    assert (decoder.counts.on_gpu, decoder.counts.on_cpu) == (0, 1)


def test_an_image_decoded_to_another_size_than_its_header_goes_to_the_cpu() -> None:
    # A decoder that turns images (torchcodec without the EXIF blanking) is caught by the size check.
    data = oriented(6)
    header = read_header(data, "phone.jpg")
    plan = T.Compose([T.CenterCrop(20)]).plan(header.width, header.height)
    decoder = GpuDecoder(CPU, jpeg="torchcodec")
    decoder.jpeg = dataclasses.replace(decoder.jpeg, applies_exif=False)  # prepare() no longer blanks
    got, bad = decoder.decode([EncodedImage(data, plan, "phone.jpg", header, 0)])
    expected = torch.from_numpy(decode_plan(data, plan, "phone.jpg")).permute(2, 0, 1)
    assert not bad and torch.equal(got[0], expected)
    assert (decoder.counts.on_gpu, decoder.counts.on_cpu) == (0, 1)


def test_the_probe_refuses_a_decoder_that_turns_images() -> None:
    codec = jpeg_decoder(CPU, "torchcodec")
    assert _probe_problem(codec.decode([_probe_bytes(codec)], CPU), CPU) is None
    turning = dataclasses.replace(codec, applies_exif=False)
    problem = _probe_problem(turning.decode([_probe_bytes(turning)], CPU), CPU)
    assert problem is not None and "turned by its EXIF orientation" in problem


@pytest.fixture
def folder_with_a_corrupt_jpeg(tmp_path: Path) -> tuple[Path, int]:
    root = make_sample_folder(tmp_path / "data", 32, num_classes=1)
    paths = sorted(root.glob("*/*.jpg"))
    plain = [i for i, path in enumerate(paths) if read_header(path.read_bytes()).plain_jpeg]
    bad = plain[len(plain) // 2]
    data = bytearray(paths[bad].read_bytes())
    middle = len(data) // 2
    data[middle : middle + 200] = b"\xff" * 200  # header and end marker intact: only a decode can tell
    paths[bad].write_bytes(bytes(data))
    return root, bad


def decoded_on_the_gpu(root: Path) -> ImageFolder:
    """The folder as ``decode_on="cuda"`` reads it: resized and cropped to 32x32 by the GPU decoder."""
    dataset = ImageFolder(root, transform=T.Compose([T.Resize(40), T.CenterCrop(32)]))
    dataset.set_decode_device("cuda")
    return dataset


def test_a_corrupt_jpeg_raises_torchcodec_s_error_as_our_decode_error(
    folder_with_a_corrupt_jpeg: tuple[Path, int],
) -> None:
    root, bad = folder_with_a_corrupt_jpeg
    dataset = decoded_on_the_gpu(root)
    decoder = GpuDecoder(CPU, dataset, collate, jpeg="torchcodec")
    with pytest.raises(DecodeError, match=dataset.source.key(bad)):
        decoder(collate(dataset.__getitems__(list(range(32)))))
    assert decoder.counts.batch_retries == 1  # torchcodec refused the batch, then the one image


def test_a_corrupt_jpeg_goes_through_the_error_policy_with_torchcodec(
    folder_with_a_corrupt_jpeg: tuple[Path, int],
) -> None:
    root, bad = folder_with_a_corrupt_jpeg
    dataset = decoded_on_the_gpu(root)
    dataset.set_error_policy("skip", quarantine=root.parent / "bad.tsv")
    images, labels = GpuDecoder(CPU, dataset, collate, jpeg="torchcodec")(
        collate(dataset.__getitems__(list(range(32))))
    )
    assert images.shape[0] == labels.shape[0] == 31
    assert [sample.position for sample in dataset.error_policy.bad_samples()] == [bad]


def test_torchcodec_s_allocator_failures_are_never_taken_for_a_bad_image() -> None:
    where = "decode_batched_hardware, /src/torchcodec/_core/DecodeJpegCuda.cpp:381, "
    for message in ("Failed to decode batch: 5", "nvjpegDecode failed: 5", "Failed to synchronize CUDA stream: 700"):
        with pytest.raises(RuntimeError, match=message):
            _raise_if_out_of_memory(RuntimeError(where + message))
    _raise_if_out_of_memory(RuntimeError(where + "Failed to decode batch: 3"))  # NVJPEG_STATUS_BAD_JPEG: a bad image
    _raise_if_out_of_memory(RuntimeError(where + "Failed to get image info: 52"))


@uses_torchvision
def test_the_environment_variable_chooses_the_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "torchvision")
    assert GpuDecoder(CPU).jpeg.name == "torchvision"
    monkeypatch.setenv(ENV, "nvimgcodec")
    with pytest.raises(ValueError, match="torchcodec, torchvision"):
        GpuDecoder(CPU)


def without(*modules: str) -> str:
    """Run in a fresh interpreter where ``modules`` cannot be imported: the decoder GpuDecoder chooses."""
    code = (
        "import sys, warnings\n"
        f"for name in {modules!r}: sys.modules[name] = None\n"  # `import name` now raises ImportError
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import torch\n"
        "from fastloader.image.gpu_decode import GpuDecoder\n"
        "from fastloader.errors import JpegDecoderUnavailable\n"
        "try:\n"
        "    decoder = GpuDecoder(torch.device('cpu'))\n"
        "except JpegDecoderUnavailable as error:\n"
        "    print('unavailable:', error)\n"
        "else:\n"
        "    print('chosen:', decoder.jpeg.name)\n"
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_without_torchcodec_torchvision_is_chosen() -> None:
    assert without("torchcodec") == "chosen: torchvision"


def test_without_either_the_error_names_what_to_install() -> None:
    line = without("torchcodec", "torchvision")
    assert line.startswith("unavailable:") and "pip install 'fastloader[gpu]'" in line
    assert "torchcodec is not usable: ModuleNotFoundError" in line and "torchvision is not usable: Module" in line
