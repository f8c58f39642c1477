"""Running a drawn case: the datasets and loaders it names, its loop, and what each epoch delivered.

A delivered sample is recorded as ``(key, digest)``: the sample's index and the draws its worker's random
generators made for it (map-style and stream datasets), or its label and the CRC32 of its pixels (images).
"""

from __future__ import annotations

import json
import os
import random
import signal
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, WeightedRandomSampler

from fastloader import DataLoaderX
from fastloader.datasets import ImageFolder
from fastloader.samplers import DistributedSampler as SplitSampler
from fastloader.transforms import CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize
from tests.helpers import blocked_writing, pid_alive, wait_until
from tests.images import image_bytes
from tests.oracle.cases import Case
from tests.oracle.datasets import BatchesOf, Indexed, Killing, NumpyOrder, StatefulStream, Stream

Record = tuple[Any, Any]
SEED = 1234  # torch's global seed before each loader is made (the interrupted run's too)
OTHER_SEED = 99  # the "new process" a resumed loader is made in
KILLER_AT = 5
PAYLOAD = 256 * 1024  # a sample's extra bytes where a worker is killed writing: more than a pipe holds
KILL_WAIT_S = 60.0  # guard: how long the hook waits for a worker to block writing, then to be dead
LINK_LABEL = 3  # the class of the link out of the root (alone in it): its records are known by their label


class World:
    """What one case runs on: its folder of images (made once per case) and its quarantine and flag files."""

    def __init__(self, case: Case, folder: Path) -> None:
        self.case, self.folder = case, folder
        if case.dataset == "images":
            self.images = folder / "images"
            for index in range(case.size):
                path = self.images / f"class_{index % 3}" / f"{index:04d}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(image_bytes(index, seed=case.seed))
            if case.policy != "raise":
                (self.images / "class_0" / "bad.jpg").write_bytes(b"\xff\xd8 not a jpeg")
            if case.outside_link:  # a dataset's link to an image elsewhere on the machine
                secret = folder / "outside" / "secret.jpg"
                secret.parent.mkdir()
                secret.write_bytes(image_bytes(case.size, seed=case.seed))
                self.link = self.images / f"class_{LINK_LABEL}" / "link.jpg"
                self.link.parent.mkdir()
                self.link.symlink_to(secret)

    def dataset(self, plain: bool = False, run: str = "run") -> Any:
        """The case's dataset; ``plain``: the reference's (no kill, no cache, not confined: torchvision's reads)."""
        case = self.case
        if case.dataset == "map" or (plain and case.dataset in ("killer_once", "killer_always")):
            return Indexed(case.size)
        if case.dataset == "stream":
            return Stream(case.size)
        if case.dataset == "stateful_stream":
            return StatefulStream(case.size)
        if case.dataset == "images":
            # The decoded cache holds a fixed transform's pixels: the eval pipeline then, the train one otherwise.
            steps = [Resize(28), CenterCrop(24)] if case.cache else [RandomResizedCrop(24), RandomHorizontalFlip()]
            transform = Compose(steps, exact_decode=case.exact)
            confine = case.confine and not plain
            index_path = self.folder / ("index-confined" if confine else "index")
            folder = ImageFolder(self.images, transform=transform, index_path=index_path, confine=confine)
            folder.set_error_policy(case.policy)
            if case.cache and not plain:
                folder.set_cache(self.folder / "cache" / "decoded")
            return folder
        flag = self.folder / f"{run}.killed" if case.dataset == "killer_once" else None
        policy = case.policy if case.dataset == "killer_once" else "skip"
        payload = PAYLOAD if case.kill_how == "writing" and case.kill else 0
        return Killing(case.size, KILLER_AT, flag, policy, self.folder / f"{run}.quarantine.tsv", payload)


def loader_args(case: Case, dataset: Any, batch_size: int, workers: int) -> dict[str, Any]:
    """The arguments both loaders take (torch's signature)."""
    args: dict[str, Any] = {"num_workers": workers, "drop_last": case.drop_last}
    if workers > 0:
        args["persistent_workers"] = case.persistent
        args["in_order"] = case.in_order
        if case.prefetch is not None:
            args["prefetch_factor"] = case.prefetch
    order = case.order
    if order in ("tuples", "arrays"):
        args.pop("drop_last")
        args["batch_sampler"] = BatchesOf(len(dataset), batch_size, order[:-1] if order == "tuples" else "array")
        return args
    args["batch_size"] = batch_size
    if order == "shuffle":
        args["shuffle"] = True
    elif order == "generator":
        args["shuffle"] = True
        args["generator"] = torch.Generator().manual_seed(case.seed)
    elif order == "weighted":
        weights = [1.0 + (i % 3) for i in range(len(dataset))]
        generator = torch.Generator().manual_seed(case.seed)
        args["sampler"] = WeightedRandomSampler(weights, len(dataset), generator=generator)
    elif order == "distributed":
        args["sampler"] = DistributedSampler(dataset, num_replicas=2, rank=case.seed % 2, seed=case.seed)
    elif order == "numpy":
        args["sampler"] = NumpyOrder(len(dataset), case.seed)
    return args


def make_loader(
    case: Case,
    dataset: Any,
    *,
    torch_loader: bool = False,
    batch_size: int | None = None,
    workers: int | None = None,
    worker_method: str | None = None,
) -> Any:
    batch = case.batch_size if batch_size is None else batch_size
    count = case.workers if workers is None else workers
    args = loader_args(case, dataset, batch, count)
    if torch_loader:
        return DataLoader(dataset, **args)
    extras: dict[str, Any] = {"stall_warning": None}
    method = case.worker_method if worker_method is None else worker_method
    # Ray actors make batches for workers > 0 only: without workers the loader runs in this process
    extras["worker_method"] = "process" if method == "ray" and count == 0 else method
    if case.order == "seed":
        args["shuffle"] = True
        extras["seed"] = case.seed
    return DataLoaderX(dataset, **args, **extras)


def rank_loader(case: Case, dataset: Any, ranks: int, rank: int, workers: int, method: str) -> DataLoaderX[Any]:
    """Rank ``rank`` of ``ranks`` simulated in this process: a DataLoaderX over that rank's split (fastloader's
    own for the order "seed", torch's DistributedSampler for "distributed"), its replicas and rank explicit,
    its workers ``method``'s."""
    if case.order == "seed":
        sampler: Any = SplitSampler(len(dataset), num_replicas=ranks, rank=rank, seed=case.seed)
    else:
        sampler = DistributedSampler(dataset, num_replicas=ranks, rank=rank, seed=case.seed)
    args = loader_args(case, dataset, case.batch_size, workers)
    args.pop("shuffle", None)
    return DataLoaderX(dataset, **{**args, "sampler": sampler}, stall_warning=None, worker_method=method)


def records(batch: Any, images: bool) -> list[Record]:
    """The samples of one batch, each ``(key, digest)``."""
    first, second = batch[0], batch[1]  # (a third column: the payload of a worker killed writing)
    if images:  # (pixels N x C x H x W uint8, labels)
        return [(int(label), zlib.crc32(row.contiguous().numpy().tobytes())) for row, label in zip(first, second)]
    return [(int(index), float(value)) for index, value in zip(first, second)]


def seed_all(seed: int) -> None:
    """The training process's three global generators, as a script seeds them (the reference and each run
    start alike; with ``num_workers=0`` the dataset draws from them)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def set_epoch(loader: Any, epoch: int) -> None:
    if isinstance(loader, DataLoaderX):
        loader.set_epoch(epoch)
        return
    # torch's loader: the epoch reaches the sampler (and the dataset) as DataLoaderX forwards it.
    for target in (loader.sampler, getattr(loader.batch_sampler, "sampler", None), loader.dataset):
        method = getattr(target, "set_epoch", None)
        if callable(method):
            method(epoch)


Hook = Callable[[Any, int, int], None]  # (iterator, epoch, batch received)


def epochs(case: Case, loader: Any, first: int = 0, hook: Hook | None = None, received: int = 0) -> list[list[Record]]:
    """The case's loop from epoch ``first``: each epoch's records (cut short as the case says; ``received``:
    batches of the first epoch the loop had before, which count towards its cut)."""
    out = []
    images = case.dataset == "images"
    for epoch in range(first, case.epochs):
        if case.loop == "set_epoch" or not isinstance(loader, DataLoaderX):
            # DataLoaderX advances its sampler's epoch by itself at each iter() (docs/differences.md): torch's
            # loader is told, as a training loop that calls DistributedSampler.set_epoch tells it.
            set_epoch(loader, epoch)
        got: list[Record] = []
        iterator = iter(loader)
        before = received if epoch == first else 0
        for number, batch in enumerate(iterator):
            got.extend(records(batch, images))
            if hook is not None:
                hook(iterator, epoch, number)
            if case.loop == "cut" and before + number + 1 >= case.cut:
                break
        del iterator
        out.append(got)
    return out


def kill_a_worker(case: Case) -> Hook:
    """SIGKILL one of the loader's workers after the batch the case names: the first (likely idle), or one
    blocked writing its result (the loop waits until one is), and wait until it is dead."""

    def hook(iterator: Any, epoch: int, number: int) -> None:
        if case.kill != (epoch, number):
            return
        if case.worker_method == "ray":
            iterator._source.pool.ray.kill_one()  # an actor of the fake cluster (tests/oracle/fake_ray.py)
            return
        workers = iterator._source._workers  # torch's iterator under the prefetch thread
        pids = [worker.pid for worker in workers]
        if case.kill_how == "writing":
            found: list[int] = []

            def one_writing() -> bool:
                found[:] = [pid for pid in pids if blocked_writing(pid)]
                return bool(found)

            assert wait_until(one_writing, KILL_WAIT_S), f"no worker blocked writing after batch {number}"
            pids = found
        os.kill(pids[0], signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(pids[0]), KILL_WAIT_S)

    return hook


def interrupted(case: Case, loader: Any) -> tuple[list[list[Record]], dict[str, Any], bool]:
    """The case's loop up to its resume point: the epochs seen (the last one partly), the state there, and
    whether that epoch had ended before the resume batch (the state then names the next epoch)."""
    assert case.resume is not None
    stop_epoch, stop_batch = case.resume
    images = case.dataset == "images"
    seen: list[list[Record]] = []
    state: dict[str, Any] = {}
    for epoch in range(stop_epoch + 1):
        if case.loop == "set_epoch":
            set_epoch(loader, epoch)
        got: list[Record] = []
        iterator = iter(loader)
        for number, batch in enumerate(iterator):
            got.extend(records(batch, images))
            if epoch == stop_epoch and number == stop_batch:
                state = json.loads(json.dumps(loader.state_dict()))  # what a checkpoint keeps
                break
            if case.loop == "cut" and number + 1 >= case.cut:
                break
        del iterator
        seen.append(got)
    if not state:  # the epoch ended before the resume batch: the state after it
        return seen, json.loads(json.dumps(loader.state_dict())), True
    return seen, state, False
