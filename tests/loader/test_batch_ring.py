"""DataLoaderX's batch ring: a slot is never written while any tensor still views it, whatever the training loop
keeps; real workers, real JPEGs, every pixel checked against a fresh decode of the same samples."""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import signal
from typing import Any

import pytest
import torch

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets.base import ImageDataset
from fastloader.image.batching import collate
from fastloader.torch_internals import worker_processes
from tests.helpers import child_processes, shm_files, wait_until
from tests.transforms import encode, photo

EVAL = T.Compose([T.Resize(40), T.CenterCrop(32)])
TRAIN = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])


class Photos:
    """Real photographs of varied sizes, JPEG-encoded; item i's label is i (so a batch names its samples)."""

    def __init__(self, count: int, corrupt: frozenset[int] = frozenset()) -> None:
        self.blobs = [encode(photo(70 + 5 * i % 90, 50 + 7 * i % 80, seed=i), "jpeg") for i in range(count)]
        for index in corrupt:
            self.blobs[index] = b"\xff\xd8 not a JPEG"

    def __len__(self) -> int:
        return len(self.blobs)

    def read(self, index: int) -> bytes:
        return self.blobs[index]

    def label(self, index: int) -> int:
        return index

    def key(self, index: int) -> str:
        return f"photo-{index}"


def photos(count: int = 60, transform: Any = EVAL, corrupt: frozenset[int] = frozenset()) -> ImageDataset[Any]:
    return ImageDataset(Photos(count, corrupt), transform=transform)


class Reference:
    """Each sample's pixels as the dataset's single-sample path decodes them (no batch buffer, no ring)."""

    def __init__(self, dataset: ImageDataset[Any]) -> None:
        self.dataset = dataset
        self.images: dict[int, torch.Tensor] = {}

    def check(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        for image, label in zip(images, labels.tolist(), strict=True):
            if label not in self.images:
                self.images[label] = self.dataset[label][0].clone()
            assert torch.equal(image, self.images[label]), f"sample {label}: pixels changed"


def in_ring(loader: DataLoaderX[Any], tensor: torch.Tensor) -> bool:
    ring = loader._runtime.ring
    if ring is None:
        return False
    start = ring.ring._memory.ctypes.data
    return start <= tensor.untyped_storage().data_ptr() < start + ring.ring.nbytes


def ring_maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum("fastloader-batch-ring" in line for line in maps)


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_no_batch_the_loop_keeps_is_ever_overwritten(workers: int, persistent: bool) -> None:
    """Batches held across steps, some kept forever, the others dropped at random, an early break: every
    batch is checked when it arrives, the held ones at every step, and all that were kept at the end."""
    dataset = photos()
    reference = Reference(dataset)
    loader = DataLoaderX(
        dataset, batch_size=4, shuffle=True, seed=3, num_workers=workers, persistent_workers=persistent
    )
    choose = random.Random(0)
    forever: list[tuple[torch.Tensor, torch.Tensor]] = []
    held: list[tuple[torch.Tensor, torch.Tensor]] = []
    viewed = 0
    for epoch in range(4):
        for step, (images, labels) in enumerate(loader):
            reference.check(images, labels)
            viewed += in_ring(loader, images)
            held.append((images, labels))
            if choose.random() < 0.15:
                forever.append((images, labels))
            while held and choose.random() < 0.6:
                del held[choose.randrange(len(held))]
            for kept_images, kept_labels in held + forever:
                reference.check(kept_images, kept_labels)
            del images, labels
            if epoch == 1 and step == 6:
                break  # the rest of this epoch's batches are dropped unseen
    for images, labels in held + forever:
        reference.check(images, labels)
    stats = loader.stats()["batch_ring"]
    assert viewed > stats["slots"] and stats["reused"] > stats["slots"]  # slots were used again and again
    assert len(forever) >= 5


def test_keeping_more_batches_than_the_ring_holds_falls_back_to_fresh_buffers() -> None:
    dataset = photos()
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2)
    kept = [batch for _ in range(2) for batch in loader]
    stats = loader.stats()["batch_ring"]
    assert len(kept) == 30 and stats["slots"] == 2 * 2 + 2 + 4  # prefetch_factor x workers + max_prefetch + 4
    assert stats["reused"] == stats["slots"] and stats["fresh"] == len(kept) - stats["slots"]
    assert sum(in_ring(loader, images) for images, _ in kept) == stats["slots"]
    assert stats["in_use"] == stats["slots"]
    reference = Reference(dataset)
    for images, labels in kept:
        reference.check(images, labels)


def test_ring_on_and_off_give_the_same_random_crops() -> None:
    dataset = photos(transform=TRAIN)
    on, off = (
        DataLoaderX(dataset, batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(1))
        for _ in range(2)
    )
    off._plan = dataclasses.replace(off._plan, batch_ring=False)
    count = 0
    for (images, labels), (plain, plain_labels) in zip(on, off, strict=True):
        assert torch.equal(labels, plain_labels) and torch.equal(images, plain)
        count += in_ring(on, images)
    assert count > 0 and off.stats()["batch_ring"] is None and on.stats()["batch_ring"]["fresh"] == 0


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_nothing_is_left_once_the_loader_its_workers_and_its_batches_are_gone(method: str) -> None:
    gc.collect()  # a ring an earlier test left to the collector goes now, not while this one counts
    before_shm, before_maps = shm_files(), ring_maps()
    dataset = photos(24)
    reference = Reference(dataset)
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context=method)
    batches = [batch for _ in range(2) for batch in loader]
    assert sum(in_ring(loader, images) for images, _ in batches) > 0
    assert ring_maps() == before_maps + 1
    workers = worker_processes(loader._iterator)
    del loader
    gc.collect()
    assert wait_until(lambda: not any(process.is_alive() for process in workers), timeout=10)
    assert ring_maps() == before_maps + 1  # the batches still view the ring
    for images, labels in batches:
        reference.check(images, labels)
    del batches, images, labels
    gc.collect()
    assert ring_maps() == before_maps and shm_files() <= before_shm


def test_a_killed_worker_leaves_every_held_batch_intact() -> None:
    dataset = photos()
    reference = Reference(dataset)
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=2, num_workers=2)
    iterator = iter(loader)
    held = [next(iterator) for _ in range(3)]
    os.kill(worker_processes(iterator._source)[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(?s?\)? .*\) .*(killed|exited)"):
        for batch in iterator:
            held.append(batch)
    del iterator
    gc.collect()
    in_ring_held = sum(in_ring(loader, images) for images, _ in held)
    # Once the dead worker's iterator has shut down, the slots it was sent come back (the dead write nothing).
    assert wait_until(lambda: loader.stats()["batch_ring"]["in_use"] == in_ring_held, timeout=15)
    assert wait_until(lambda: child_processes() == 0, timeout=15)
    for _ in range(2):  # new workers write the ring again
        for images, labels in loader:
            reference.check(images, labels)
            for kept_images, kept_labels in held:
                reference.check(kept_images, kept_labels)
    del images, labels
    assert loader.stats()["batch_ring"]["in_use"] == in_ring_held  # nothing but what the loop still holds


@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_error_holds_its_slot_only_until_no_worker_can_write_it(persistent: bool) -> None:
    """The batch holding a bad image raises (torch goes on with the next one); its slot, never delivered, comes
    back after the epoch: twelve epochs with one failed batch each never run out of the ten slots."""
    dataset = photos(corrupt=frozenset({9}))
    reference = Reference(dataset)
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, persistent_workers=persistent)
    for _ in range(12):
        iterator, failed, received = iter(loader), 0, 0
        while True:
            try:
                images, labels = next(iterator)
            except StopIteration:
                break
            except Exception as error:  # noqa: BLE001 - the worker's error, re-raised here
                assert "photo-9" in str(error)
                failed += 1
                continue
            reference.check(images, labels)
            received += 1
        assert (failed, received) == (1, 14)
    stats = loader.stats()["batch_ring"]
    assert stats["fresh"] == 0 and stats["slots"] == 10


def keep_boxed(batch: Any) -> Any:
    images, labels = collate(batch)
    return {"boxed": Box(images), "labels": labels}


def copy_images(batch: Any) -> Any:
    images, labels = collate(batch)
    return [images.clone(), labels]


class Box:
    """A container of the user's own: the ring does not look inside it, torch sends its tensor as a copy."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


@pytest.mark.parametrize("case", ["skipped sample", "copying collate", "own container"])
def test_a_batch_that_does_not_view_its_slot_gives_it_back_on_arrival(case: str) -> None:
    dataset = photos(corrupt=frozenset({5}) if case == "skipped sample" else frozenset())
    if case == "skipped sample":
        dataset.set_error_policy("skip")
    collate_fn = {"copying collate": copy_images, "own container": keep_boxed}.get(case)
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, collate_fn=collate_fn)
    reference = Reference(dataset)
    kept = []
    for _ in range(4):
        for batch in loader:
            images, labels = (batch["boxed"].tensor, batch["labels"]) if isinstance(batch, dict) else batch
            reference.check(images, labels)
            kept.append((images, labels))  # kept forever
    stats = loader.stats()["batch_ring"]
    viewing = sum(in_ring(loader, images) for images, _ in kept)
    assert stats["in_use"] == viewing  # every slot not viewed came back
    if case == "skipped sample":
        shorter = [images for images, labels in kept if len(labels) == 3]
        assert len(shorter) == 4 and not any(in_ring(loader, images) for images in shorter)
    else:
        assert viewing == 0 and stats["fresh"] == 0 and stats["reused"] == len(kept)


def test_resume_is_exact_with_the_ring() -> None:
    dataset = photos(transform=TRAIN)

    def loader() -> DataLoaderX[Any]:
        generator = torch.Generator().manual_seed(5)  # the same workers' seeds for each run
        return DataLoaderX(dataset, batch_size=4, shuffle=True, num_workers=2, generator=generator)

    whole = [(images.clone(), labels.clone()) for images, labels in loader()]
    first = loader()
    iterator = iter(first)
    head = [next(iterator) for _ in range(6)]
    state = first.state_dict()
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    tail = list(resumed)
    assert len(head) + len(tail) == len(whole)
    for (images, labels), (expected, expected_labels) in zip(head + tail, whole, strict=True):
        assert torch.equal(labels, expected_labels) and torch.equal(images, expected)
    assert sum(in_ring(resumed, images) for images, _ in tail) > 0


def test_a_dataset_with_fields_gets_its_image_column_from_the_ring() -> None:
    dataset = ImageDataset(Photos(24), transform=EVAL, fields={"image": "image", "label": "label"})
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2)
    reference = Reference(photos(24))
    count = 0
    for _ in range(2):
        for batch in loader:
            reference.check(batch["image"], batch["label"])
            count += in_ring(loader, batch["image"])
    assert count > 0 and loader.stats()["batch_ring"]["fresh"] == 0


def test_the_stage_clock_still_times_the_hand_off() -> None:
    loader = DataLoaderX(photos(), batch_size=4, num_workers=2)
    for _ in loader:
        pass
    stages = loader.stats()["stages"]
    assert stages["handoff"]["total_s"] > 0 and stages["handoff"]["where"] == "main process"
    assert loader.stats()["batch_ring"]["reused"] == 15


def test_no_ring_where_batches_have_no_fixed_buffer() -> None:
    for dataset in (photos(transform=T.Compose([T.Resize(40)])), photos(transform=None)):
        loader = DataLoaderX(dataset, batch_size=4, num_workers=2, collate_fn=list)
        next(iter(loader))
        assert loader.stats()["batch_ring"] is None
    unbatched = DataLoaderX(photos(), batch_size=None, num_workers=2)
    next(iter(unbatched))
    assert unbatched.stats()["batch_ring"] is None
