"""torchcodec's nvJPEG decode on CUDA (fastloader.image.gpu_jpeg): chosen when installed, the pixels of
torchvision's nvJPEG and of the CPU path, never turned by an EXIF orientation, no deprecation warning."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from fastloader.image.decode import decode_plan, read_header
from fastloader.image.gpu_decode import GpuDecoder
from fastloader.sample import make_sample_folder
from tests.image.test_gpu_jpeg import items_of, oriented

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytest.importorskip("torchcodec.decoders", reason="torchcodec is not installed")
CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, bytes]]:
    root = make_sample_folder(tmp_path_factory.mktemp("photos"), 120, num_classes=1)
    files = [(str(path), path.read_bytes()) for path in sorted(root.glob("*/*.jpg"))]
    return [(key, data) for key, data in files if read_header(data, key).plain_jpeg]


def test_torchcodec_is_chosen_on_cuda_and_warns_of_nothing(photos: list[tuple[str, bytes]]) -> None:
    decoder = GpuDecoder(CUDA)  # a torchcodec that fails its probe on this GPU would show why in the log
    assert decoder.jpeg.name == "torchcodec", decoder.jpeg
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        images, bad = decoder.decode(items_of(photos, 96))
    torch.cuda.synchronize()
    assert not bad and images.device == CUDA and decoder.counts.on_gpu == len(photos)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchcodec_decodes_the_pixels_of_torchvision_and_the_cpu_path(photos: list[tuple[str, bytes]]) -> None:
    # Tolerance: per image, at most 1 level on average from torchvision's nvJPEG (the same library; its
    # hardware and software paths may round differently) and 3 from the CPU path (IDCT and resampler).
    items = items_of(photos, 96)
    codec, _ = GpuDecoder(CUDA, jpeg="torchcodec").decode(items)
    vision, _ = GpuDecoder(CUDA, jpeg="torchvision").decode(items)
    cpu = torch.stack([torch.from_numpy(decode_plan(i.data, i.plan, i.key)).permute(2, 0, 1) for i in items])
    codec, vision = codec.cpu().float(), vision.cpu().float()
    assert (codec - vision).abs().mean(dim=(1, 2, 3)).max() <= 1.0
    assert (codec - cpu.float()).abs().mean(dim=(1, 2, 3)).max() < 3.0


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_exif_orientation_is_not_applied_on_cuda(orientation: int) -> None:
    data = oriented(orientation)
    decoder = GpuDecoder(CUDA, jpeg="torchcodec")
    image = decoder.jpeg.decode([decoder.jpeg.prepare(data)], CUDA)[0]  # type: ignore[list-item]
    stored = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
    assert image.shape == stored.shape  # 3x24x40, never 3x40x24
    assert (image.cpu().float() - stored.float()).abs().mean() < 3.0  # a mirrored image is > 30


def test_a_corrupt_jpeg_in_a_cuda_batch_leaves_the_others_and_is_named(photos: list[tuple[str, bytes]]) -> None:
    data = bytearray(photos[0][1])
    middle = len(data) // 2
    data[middle : middle + 200] = b"\xff" * 200  # header and end marker intact: only a decode can tell
    good = items_of(photos[1:9], 64)
    clean, _ = GpuDecoder(CUDA, jpeg="torchcodec").decode(good)
    decoder = GpuDecoder(CUDA, jpeg="torchcodec")
    images, bad = decoder.decode([*good, *items_of([("bad/corrupt.jpg", bytes(data))], 64)])
    assert torch.equal(images[:8], clean)  # the batch's failure and retry changed none of the good images
    # nvJPEG refuses it (then the CPU does, naming it) or decodes it without an error: nothing else
    assert all(row == 8 and "bad/corrupt.jpg" in str(error) for row, error in bad)
    assert decoder.counts.bad + decoder.counts.on_gpu == 9 and decoder.counts.batch_retries >= len(bad)
