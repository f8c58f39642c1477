"""DataLoaderX's batch ring, whatever the training loop does with a batch it holds: a forked child keeps it, its
storage moves to shared memory, a child iterates the loader, a worker is killed. Real forks, real workers, real
SIGKILL; every pixel checked against a fresh decode of the same samples."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as torch_mp
from torch.utils.data import get_worker_info

from fastloader import DataLoaderX
from fastloader.datasets.base import ImageDataset
from fastloader.torch_internals import worker_processes
from tests.helpers import wait_until
from tests.loader.test_batch_ring import EVAL, Photos, Reference, in_ring, photos


def slot_address(images: torch.Tensor) -> int:
    return int(images.untyped_storage().data_ptr())


def in_use(loader: DataLoaderX[Any]) -> int:
    """The ring's slots booked now (a batch, or an array of one, still views them)."""
    return int(loader.stats()["batch_ring"]["in_use"])


def drain(loader: DataLoaderX[Any], reference: Reference, epochs: int, batches: Any = ()) -> list[int]:
    """Iterate (``batches`` first, then ``epochs`` epochs), checking each batch and keeping none; the address of
    each batch's images."""
    addresses = []
    for source in [batches] + [loader] * epochs:
        for images, labels in source:
            reference.check(images, labels)
            addresses.append(slot_address(images))
    return addresses


def _check_when_told(images: torch.Tensor, expected: torch.Tensor, go: int) -> None:
    """A forked child that saves a batch in the background: it reads the batch once the parent moved on."""
    os.read(go, 1)
    os._exit(0 if torch.equal(images, expected) else 1)


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing.Process"])
def test_a_batch_held_across_fork_never_changes_for_the_child(how: str) -> None:
    loader, reference, iterator = _ring_loader(seed=6)
    images, _ = next(iterator)
    assert in_ring(loader, images)
    address, expected = slot_address(images), images.clone()
    go, told = os.pipe()
    process = None
    if how == "os.fork":
        pid = os.fork()
        if pid == 0:
            try:
                _check_when_told(images, expected, go)
            finally:
                os._exit(2)
    else:
        process = multiprocessing.get_context("fork").Process(target=_check_when_told, args=(images, expected, go))
        process.start()
    del images  # the parent is done with it; the child is not
    addresses = drain(loader, reference, epochs=2, batches=iterator)
    os.write(told, b"x")
    if process is None:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    else:
        process.join()
        code = process.exitcode
    os.close(go), os.close(told)
    assert code == 0, "the child's batch changed"
    assert address not in addresses  # no batch of the parent's was written into it while the child lived
    drain(loader, reference, epochs=1)
    assert in_use(loader) == 0  # the child is gone: the slot is free again (which free slot serves next varies)


@pytest.mark.parametrize("how", ["share_memory_", "torch.multiprocessing.Queue"])
def test_an_array_of_a_batch_whose_storage_moved_never_changes(how: str) -> None:
    """torch moves the storage of a batch that is shared (share_memory_(), or put on a torch.multiprocessing
    queue, which shares it as it pickles it) to new shared memory: an array made from the batch before still
    points at the slot."""
    loader, reference, iterator = _ring_loader(seed=7)
    images, labels = next(iterator)
    assert in_ring(loader, images)
    address, pixels = slot_address(images), images.numpy()
    expected = pixels.copy()
    if how == "share_memory_":
        images.share_memory_()
    else:
        queue = torch_mp.get_context("fork").Queue()
        queue.put((images, labels))
        received, _ = queue.get(timeout=60)
        assert torch.equal(received, torch.from_numpy(expected)) and received.is_shared()
        queue.close()
        queue.join_thread()  # the feeder thread has let go of what it pickled (it may lag on a loaded machine)
        del received
    assert images.is_shared() and slot_address(images) != address  # its storage moved; `pixels` did not
    del images
    addresses = drain(loader, reference, epochs=2, batches=iterator)
    assert np.array_equal(pixels, expected), "an array of a batch changed"
    assert address not in addresses
    del pixels
    drain(loader, reference, epochs=1)
    assert in_use(loader) == 0  # nothing views the slot any more: it is free again


def test_a_forked_child_iterates_the_loader_with_a_ring_of_its_own() -> None:
    loader, reference, iterator = _ring_loader(seed=8)
    held = [next(iterator) for _ in range(3)]
    expected = [(images.clone(), labels.clone()) for images, labels in held]
    assert all(in_ring(loader, images) for images, _ in held)
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            held.clear()  # the child has no use for them: its copies go (and the slots with them, in its books)
            drain(loader, Reference(loader.dataset), epochs=2)
            code = 0 if loader._runtime.ring is not None and loader.stats()["batch_ring"]["reused"] > 0 else 3
        except BaseException:  # noqa: BLE001 - reported by the exit code, the traceback on stderr
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child could not iterate the loader"
    for (images, labels), (want, want_labels) in zip(held, expected, strict=True):
        assert torch.equal(labels, want_labels) and torch.equal(images, want), "a batch of the parent's changed"
    drain(loader, reference, epochs=1, batches=iterator)


class BlocksWorkerZero(ImageDataset[Any]):
    """Worker 0's first batch never ends (it says so in ``blocked``); every other batch is decoded as usual."""

    def __init__(self, blocked: Path) -> None:
        super().__init__(Photos(120), transform=EVAL)
        self.blocked = blocked

    def __getitems__(self, indices: list[int]) -> Any:
        info = get_worker_info()
        if info is not None and info.id == 0 and not self.blocked.exists():
            self.blocked.touch()
            threading.Event().wait()  # until killed
        return super().__getitems__(indices)


def test_the_slots_of_a_killed_worker_come_back_once_torch_finds_it_dead(tmp_path: Path) -> None:
    """The training loop runs in a thread (torch's SIGCHLD handler serves the main thread only), keeps every batch
    and goes on past the dead worker's error, as torch lets it: each slot serves one kept batch, the two the dead
    worker had included."""
    dataset = BlocksWorkerZero(tmp_path / "blocked")
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    errors: list[BaseException] = []
    started = threading.Event()
    workers: list[Any] = []

    def train() -> None:
        iterator = iter(loader)
        workers.extend(worker_processes(iterator._source))
        started.set()
        while True:
            try:
                kept.append(next(iterator))
            except StopIteration:
                return
            except RuntimeError as error:  # torch found the worker dead, and goes on without it
                errors.append(error)

    thread = threading.Thread(target=train)
    thread.start()
    assert started.wait(60) and wait_until(dataset.blocked.exists, timeout=60)
    try:
        os.kill(workers[0].pid, signal.SIGKILL)
        thread.join()
    except RuntimeError as error:  # torch's SIGCHLD handler, if an earlier iterator in this process set it
        assert "killed by signal" in str(error)
    thread.join()
    assert [str(error) for error in errors] == [f"DataLoader worker (pid(s) {workers[0].pid}) exited unexpectedly"]
    reference = Reference(photos(120))
    for images, labels in kept:
        reference.check(images, labels)
    assert len(kept) == 30 - 2  # worker 0's two batches are lost, as with torch's loader
    stats = loader.stats()["batch_ring"]
    assert sum(in_ring(loader, images) for images, _ in kept) == stats["slots"]


def _ring_loader(seed: int) -> tuple[DataLoaderX[Any], Reference, Any]:
    """A shuffled loader of 40 photos through the batch ring on 2 workers, their reference pixels, and its epoch."""
    dataset = photos(40)
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=seed, num_workers=2)
    return loader, Reference(dataset), iter(loader)
