"""The GPU side of the image path: normalize after the copy, and nvJPEG decode (decode_on="cuda")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torchvision.transforms import Normalize

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.sample import make_sample_folder
from tests.loader.test_normalize import MEAN, STD, UInt8Images

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_normalize_on_the_gpu_equals_torchvision() -> None:
    loader = DataLoaderX(UInt8Images(), batch_size=8, normalize=(MEAN, STD), pin_memory=True, local_rank=0)
    plain = DataLoaderX(UInt8Images(), batch_size=8, device="cpu")
    for (images, labels), (raw, raw_labels) in zip(loader, plain):
        assert images.device == torch.device("cuda", 0) and images.dtype == torch.float32
        expected = Normalize(MEAN, STD)(raw.float() / 255)
        torch.testing.assert_close(images.cpu(), expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(labels.cpu(), raw_labels)


def test_bf16_channels_last_on_the_gpu() -> None:
    loader = DataLoaderX(
        UInt8Images(), batch_size=8, normalize=(MEAN, STD), normalize_dtype=torch.bfloat16, channels_last=True
    )
    images = next(iter(loader))[0]
    assert images.dtype == torch.bfloat16 and images.is_contiguous(memory_format=torch.channels_last)


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # about 1% of the sample are CMYK JPEGs, grayscale JPEGs or PNGs named .jpg: the CPU fallback
    return make_sample_folder(tmp_path_factory.mktemp("sample"), 300, num_classes=3)


def decoders() -> list[str]:
    """The JPEG decoders installed here (torchcodec, torchvision): the GPU path is checked with each."""
    return [name for name in ("torchcodec", "torchvision") if importlib.util.find_spec(name) is not None]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchvision's decode_jpeg is deprecated
@pytest.mark.parametrize("decoder", decoders())
def test_gpu_decode_matches_cpu_decode(sample: Path, decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOADER_JPEG_DECODER", decoder)
    eval_tf = T.Compose([T.Resize(256), T.CenterCrop(224)])  # deterministic: the same plans on both paths
    cpu = DataLoaderX(ImageFolder(sample, transform=eval_tf), batch_size=64, num_workers=2, device="cpu")
    gpu = DataLoaderX(ImageFolder(sample, transform=eval_tf), batch_size=64, num_workers=2, decode_on="cuda")
    count = 0
    for (gpu_images, gpu_labels), (cpu_images, cpu_labels) in zip(gpu, cpu):
        assert gpu_images.device.type == "cuda" and gpu_images.dtype == torch.uint8
        assert gpu_images.shape == cpu_images.shape == (cpu_images.shape[0], 3, 224, 224)
        assert torch.equal(gpu_labels.cpu(), cpu_labels)
        diff = (gpu_images.cpu().float() - cpu_images.float()).abs()
        assert diff.mean() < 3.0, f"nvJPEG + GPU resize differ from the CPU path by {diff.mean():.2f} on average"
        count += gpu_images.shape[0]
    assert count == 300
    assert gpu.stats()["gpu_decoder"].startswith(f"{decoder} ")  # the decoder that ran, as the user sees it


def test_gpu_decode_train_pipeline_with_normalize(sample: Path) -> None:
    train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    loader = DataLoaderX(
        ImageFolder(sample, transform=train_tf), batch_size=50, num_workers=2, decode_on="cuda", normalize=(MEAN, STD)
    )
    for images, labels in loader:
        assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.float32
        assert images.device.type == "cuda" and torch.isfinite(images).all()
        assert labels.max() < 3
