"""The batch ring on CUDA: registered as pinned memory once, passed through torch's pin-memory step untouched,
and a slot held until its host-to-device copy's event has completed, under a busy GPU; every pixel checked."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

from fastloader import DataLoaderX
from fastloader.loader.batch_slots import LoaderRing
from fastloader.loader.device import CudaCopier
from fastloader.loader.stage_clock import TimedBatch
from tests.gpu.test_cuda_copy import busy_gpu
from tests.loader.test_batch_ring import EVAL, TRAIN, Reference, photos

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

DEVICE = torch.device("cuda", 0)


def slow_gpu(device: torch.device, repeats: int = 40) -> None:
    """Queue a long run of kernels on the current stream (hundreds of ms): copies queued after it wait."""
    a = torch.randn(8192, 8192, device=device)
    for _ in range(repeats):
        a = a @ a
        a = a / a.norm()


def test_the_ring_is_pinned_once_and_every_batch_arrives_right_under_a_busy_gpu() -> None:
    dataset = photos(96, EVAL)
    reference = Reference(dataset)
    loader = DataLoaderX(dataset, batch_size=8, shuffle=True, num_workers=2, pin_memory=True, device=DEVICE)
    for _ in range(3):
        for images, labels in loader:
            busy_gpu(images.device)  # the loop's GPU work, queued before the next copies
            assert images.device == DEVICE
            reference.check(images.cpu(), labels.cpu())
    stats = loader.stats()["batch_ring"]
    assert stats["pinned"] is True and stats["fresh"] == 0 and stats["reused"] == 3 * 12


def test_random_crops_through_the_pinned_ring_equal_those_without_it() -> None:
    dataset = photos(96, TRAIN)

    def loader(device: torch.device | str) -> DataLoaderX:
        generator = torch.Generator().manual_seed(1)
        return DataLoaderX(dataset, batch_size=8, shuffle=True, num_workers=2, device=device, generator=generator)

    plain = loader("cpu")
    plain._plan = dataclasses.replace(plain._plan, batch_ring=False)
    for (images, labels), (expected, expected_labels) in zip(loader(DEVICE), plain, strict=True):
        busy_gpu(images.device)
        assert torch.equal(images.cpu(), expected) and torch.equal(labels.cpu(), expected_labels)


def test_a_pinned_ring_batch_passes_torchs_pin_memory_step_untouched() -> None:
    ring = LoaderRing(2, 4 * 32 * 32 * 3, DEVICE)
    assert ring.ring.pinned
    taken = ring.book.take(object())
    assert taken is not None
    view = ring.ring.view(*taken)[: 4 * 32 * 32 * 3].view(4, 32, 32, 3).permute(0, 3, 1, 2)
    assert view.is_pinned()
    timed = TimedBatch([view, torch.arange(4)], None).pin_memory()
    assert timed.batch[0].data_ptr() == view.data_ptr()  # no pinned copy: the DMA reads the worker's slot
    assert timed.timing is None


def test_a_slot_comes_back_only_after_its_copy_has_completed() -> None:
    ring = LoaderRing(2, 64 << 20, DEVICE)
    copier = CudaCopier(DEVICE, non_blocking=True)
    consumer = torch.cuda.current_stream(DEVICE)
    taken = ring.book.take(object())
    assert taken is not None
    host = ring.ring.view(*taken)
    host.fill_(5)
    slow_gpu(DEVICE)  # the side stream waits for the consumer's queued work before it copies
    in_flight = copier.send([host], consumer)
    del host
    gc.collect()
    assert not in_flight.ready.query()  # the copy has not run yet...
    assert copier.copying() == 1 and ring.book.in_use() == 1  # ...so its slot is still held
    in_flight.ready.synchronize()
    assert copier.copying() == 0 and ring.book.in_use() == 0  # completed: the slot is free
    received = copier.receive(in_flight)
    assert received[0].device == DEVICE and int(received[0].float().mean().item()) == 5
