"""DataLoaderX on CUDA: side-stream copies are correct, land on cuda:local_rank, and do not grow memory."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastloader import DataLoaderX
from fastloader.loader.device import resolve_device
from tests.helpers import prefetch_threads, wait_until
from tests.loader.test_dataloader import collate_dict, same
from tests.toy_datasets import Squares

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class ChangingImages(Dataset[tuple[torch.Tensor, int]]):
    """Item i: a uint8 3x64x64 image whose content depends on i (every batch differs)."""

    def __len__(self) -> int:
        return 100 * 16

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8, generator=generator), i


class MetaTensors(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.empty(2, device="meta")  # cannot be copied to a device


def busy_gpu(device: torch.device) -> None:
    """Queue a few ms of kernels, so that copies and compute really overlap."""
    a = torch.randn(2048, 2048, device=device)
    for _ in range(4):
        a = a @ a
        a = a / a.norm()


def test_non_blocking_copies_equal_synchronous_copies_over_100_batches() -> None:
    device = torch.device("cuda", 0)
    kwargs: dict[str, Any] = {"batch_size": 16, "num_workers": 2, "pin_memory": True}
    reference = DataLoader(ChangingImages(), **kwargs)
    loader = DataLoaderX(ChangingImages(), **kwargs, local_rank=0, max_prefetch=3)
    batches = 0
    for (images, labels), (ref_images, ref_labels) in zip(loader, reference):
        busy_gpu(device)
        assert images.device == device and images.dtype == torch.uint8
        assert torch.equal(images, ref_images.to(device)) and torch.equal(labels.cpu(), ref_labels)
        batches += 1
    assert batches == 100


def test_batches_land_on_cuda_local_rank_with_structure_kept() -> None:
    rank = torch.cuda.device_count() - 1
    loader = DataLoaderX(Squares(), batch_size=8, collate_fn=collate_dict, pin_memory=True, local_rank=rank)
    assert loader.device == torch.device("cuda", rank)
    for batch, ref in zip(loader, DataLoader(Squares(), batch_size=8, collate_fn=collate_dict)):
        assert batch["image"].device == torch.device("cuda", rank)
        assert batch["label"].device == torch.device("cuda", rank)
        assert batch["keys"] == ref["keys"]  # non-tensors pass through untouched
        assert same(batch["image"].cpu(), ref["image"])


def test_consumer_on_its_own_stream_sees_complete_batches() -> None:
    stream = torch.cuda.Stream()
    loader = DataLoaderX(ChangingImages(), batch_size=32, num_workers=2, pin_memory=True)
    reference = DataLoader(ChangingImages(), batch_size=32)
    with torch.cuda.stream(stream):
        for (images, _), (ref, _) in zip(loader, reference):
            busy_gpu(images.device)
            assert torch.equal(images.cpu(), ref)


def test_one_stream_per_loader_and_reserved_memory_flat_over_5_epochs() -> None:
    loader = DataLoaderX(ChangingImages(), batch_size=64, num_workers=2, pin_memory=True, persistent_workers=True)
    reserved = []
    streams = set()
    for _ in range(5):
        for images, _ in loader:
            images.float().mean()
        torch.cuda.synchronize()
        streams.add(id(loader._runtime.copier.stream))  # type: ignore[union-attr]
        reserved.append(torch.cuda.memory_reserved(loader.device))
    assert len(streams) == 1
    assert max(reserved[1:]) <= reserved[0], f"reserved memory grew across epochs: {reserved}"


def test_transfer_error_reaches_the_consumer_and_stops_the_thread() -> None:
    before = prefetch_threads()
    with pytest.raises(NotImplementedError):
        for _ in DataLoaderX(MetaTensors(), batch_size=2):
            pass
    gc.collect()
    assert wait_until(lambda: prefetch_threads() <= before, 5.0)


def test_device_resolution_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_device(None, None).type == "cuda"
    assert resolve_device(None, "cuda") == torch.device("cuda", 0)
    assert resolve_device(0, None) == torch.device("cuda", 0)
    assert resolve_device(None, "cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="disagrees"):
        resolve_device(0, "cuda:1")
    with pytest.raises(ValueError, match="CUDA device"):
        resolve_device(torch.cuda.device_count(), None)
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count() - 1))
    assert resolve_device(None, None) == torch.device("cuda", torch.cuda.device_count() - 1)
