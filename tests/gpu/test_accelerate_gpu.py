"""fastloader.integrations.accelerate on CUDA (one process): what accelerate's own prepare loses is kept:
the side-stream copy to accelerator.device, normalize / random_flip / channels_last after it, GPU decode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.sample import make_sample_folder
from tests.integrations.common import reset_accelerate
from tests.loader.test_normalize import MEAN, STD, UInt8Images, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytest.importorskip("accelerate")
from accelerate import Accelerator  # noqa: E402

from fastloader.integrations.accelerate import prepare  # noqa: E402


@pytest.fixture
def accelerator() -> Iterator[Accelerator]:
    yield Accelerator()
    reset_accelerate()


def current() -> torch.device:
    """accelerator.device on one GPU is "cuda": the current device."""
    return torch.device("cuda", torch.cuda.current_device())


def test_normalize_flip_channels_last_after_the_copy(accelerator: Accelerator) -> None:
    loader = DataLoaderX(
        UInt8Images(), batch_size=8, normalize=(MEAN, STD), random_flip=1.0, channels_last=True, pin_memory=True
    )
    prepared = prepare(accelerator, loader)
    plain = DataLoaderX(UInt8Images(), batch_size=8, device="cpu")
    count = 0
    for (images, labels), (raw, raw_labels) in zip(prepared, plain):
        assert images.device == current() and images.dtype == torch.float32
        assert images.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(images.cpu(), reference(raw.flip(-1)), atol=1e-5, rtol=1e-5)
        assert torch.equal(labels.cpu(), raw_labels)
        count += len(labels)
    assert count == len(UInt8Images())
    assert "h2d" in prepared.stats()["stages"]  # the side-stream copy ran, in DataLoaderX


def test_gpu_decode(accelerator: Accelerator, tmp_path: Path) -> None:
    sample = make_sample_folder(tmp_path / "sample", 60, num_classes=2)
    eval_tf = T.Compose([T.Resize(256), T.CenterCrop(224)])
    loader = DataLoaderX(ImageFolder(sample, transform=eval_tf), batch_size=16, num_workers=2, decode_on="cuda")
    prepared = prepare(accelerator, loader)
    count = 0
    for images, labels in prepared:
        assert images.device == current() and images.dtype == torch.uint8
        assert images.shape[1:] == (3, 224, 224) and labels.max() < 2
        count += len(labels)
    assert count == 60 and prepared.stats()["gpu_decode"] is not None
