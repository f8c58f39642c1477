"""worker_method="thread": threads of this process run the dataset, with torch's thread-worker semantics, and
give what worker processes give (fastloader.loader.workers.thread)."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.data
import torch.utils.data._utils.worker
import torch.utils.data.dataloader
from torch.utils.data import Dataset, IterableDataset
from torch.utils.data import get_worker_info as imported_before  # a name bound before any thread worker ran

from fastloader import DataLoaderX
from fastloader.datasets import ImageFolder
from tests.images import write_image_folder
from tests.loader.worker_datasets import Numbers, Raising, Sharded

ALIASES = (
    torch.utils.data.get_worker_info,
    torch.utils.data.dataloader.get_worker_info,
    torch.utils.data._utils.worker.get_worker_info,
    imported_before,
)
MAIN = threading.get_ident()


class Recorder(Dataset[Any]):
    """Records what each worker sees (the worker info through every alias, its thread)."""

    seen: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> torch.Tensor:
        infos = [alias() for alias in ALIASES]
        info = infos[0]
        Recorder.seen.append(
            {
                "same": all(other is info for other in infos),
                "info": info,
                "thread": threading.get_ident(),
                "generator": torch.random.thread_safe_generator(),
                "main_sees": None,
            }
        )
        return torch.tensor([index])  # default_collate stacks tensors: in shared memory when it sees a worker


def test_worker_info_is_torchs_thread_worker_info_in_each_thread() -> None:
    Recorder.seen = []
    inits: list[tuple[int, Any, int]] = []
    lock = threading.Lock()

    def init(worker_id: int) -> None:
        with lock:
            inits.append((worker_id, torch.utils.data.get_worker_info(), threading.get_ident()))

    torch.manual_seed(3)
    loader = DataLoaderX(Recorder(), batch_size=2, num_workers=3, worker_method="thread", worker_init_fn=init)
    for batch in loader:
        assert torch.utils.data.get_worker_info() is None  # the training thread, while the threads run
        assert batch.is_shared() is False  # default_collate built it in ordinary memory
    assert sorted(worker for worker, _, _ in inits) == [0, 1, 2]  # once per thread
    init_threads = {worker: thread for worker, _, thread in inits}
    assert all(info is not None and info.id == worker for worker, info, _ in inits)
    assert Recorder.seen and all(seen["same"] for seen in Recorder.seen)
    base = {seen["info"].seed - seen["info"].id for seen in Recorder.seen}
    assert len(base) == 1
    for seen in Recorder.seen:
        info = seen["info"]
        assert info.worker_method == "thread" and info.num_workers == 3
        assert isinstance(info.dataset, Recorder) and info.dataset is not loader.dataset  # its own copy
        assert seen["thread"] == init_threads[info.id] and seen["thread"] != MAIN
        assert info.rng is not None and seen["generator"] is info.rng.torch_generator
        assert info.rng.torch_generator.initial_seed() == info.seed
    for alias in ALIASES:
        assert alias() is None
    assert torch.random.thread_safe_generator() is None


def test_seeds_and_draws_are_a_worker_processs() -> None:
    """The thread's seed is torch's base_seed + id, and its rng draws what a worker process's globals draw."""
    got = {}
    for method in ("process", "thread"):
        torch.manual_seed(11)
        loader = DataLoaderX(Numbers(), batch_size=3, num_workers=2, worker_method=method)
        got[method] = [pair for batch in loader for pair in zip(*(t.tolist() for t in batch))]
    assert got["thread"] == got["process"]


def _children() -> set[int]:
    pids = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as file:
                pids.update(int(pid) for pid in file.read().split())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return pids


def test_no_child_process_is_started() -> None:
    # Children of earlier tests in this process (their workers, being reaped) may remain or go: none may come.
    before, known = _children(), set(multiprocessing.active_children())
    loader = DataLoaderX(Numbers(), batch_size=2, num_workers=2, worker_method="thread", persistent_workers=True)
    for _ in range(2):
        for _batch in loader:
            assert set(multiprocessing.active_children()) <= known
            assert _children() <= before
    assert sum(thread.name.startswith("fastloader-worker-") for thread in threading.enumerate()) == 2


def _shard_in_init(worker_id: int) -> None:
    """torch's second sharding example: worker_init_fn sets the range on its copy of the dataset."""
    info = torch.utils.data.get_worker_info()
    assert info is not None
    dataset = info.dataset
    overall_start, overall_end = dataset.start, dataset.end
    per_worker = int(math.ceil((overall_end - overall_start) / float(info.num_workers)))
    dataset.start = overall_start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


class Plain(IterableDataset[int]):
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Any:
        return iter(range(self.start, self.end))


@pytest.mark.parametrize("case", ["map", "sharded", "sharded in worker_init_fn", "in_order=False"])
def test_batches_are_process_modes(case: str) -> None:
    def run(method: str) -> list[list[Any]]:
        torch.manual_seed(5)
        args: dict[str, Any] = {"batch_size": 3, "num_workers": 2, "worker_method": method}
        if case == "map":
            dataset: Any = Numbers(25)
            args["shuffle"] = True
        elif case == "in_order=False":
            dataset, args["in_order"] = Numbers(25), False
        elif case == "sharded":
            dataset = Sharded(3, 20)
        else:
            dataset, args["worker_init_fn"] = Plain(3, 20), _shard_in_init
        batches = [batch for batch in DataLoaderX(dataset, **args)]
        return [b.tolist() if isinstance(b, torch.Tensor) else [t.tolist() for t in b] for b in batches]

    thread, process = run("thread"), run("process")
    if case == "in_order=False":  # batches as they are finished, by whichever worker: the same indices
        thread, process = sorted(b[0] for b in thread), sorted(b[0] for b in process)
    assert thread == process


def test_persistent_threads_serve_three_epochs() -> None:
    inits: list[int] = []
    threads: list[set[int]] = []

    class Where(Numbers):
        def __getitem__(self, index: int) -> tuple[int, int]:
            return index, threading.get_ident()

    loader = DataLoaderX(
        Where(12),
        batch_size=2,
        num_workers=2,
        worker_method="thread",
        persistent_workers=True,
        worker_init_fn=inits.append,
    )
    for _ in range(3):
        seen = [batch for batch in loader]
        assert sorted(i for indices, _ in seen for i in indices.tolist()) == list(range(12))
        threads.append({t for _, idents in seen for t in idents.tolist()})
    assert sorted(inits) == [0, 1]
    assert threads[0] == threads[1] == threads[2] and len(threads[0]) == 2


def test_a_dataset_exception_is_raised_in_the_training_thread_naming_the_worker() -> None:
    loader = DataLoaderX(Raising(12), batch_size=2, num_workers=2, worker_method="thread")
    with pytest.raises(KeyError, match=r"(?s)sample 7 is broken.*|in DataLoader worker thread 1") as error:
        list(loader)
    assert "in DataLoader worker thread 1" in str(error.value)  # batch 3 (7) is worker 1's: torch's round robin


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    write_image_folder(tmp_path / "images", count=12)
    (tmp_path / "images" / "class_0" / "bad.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return tmp_path


@pytest.mark.parametrize("policy", ["raise", "skip", "replace"])
def test_error_policies_as_in_process_mode(folder: Path, policy: str) -> None:
    def run(method: str) -> Any:
        dataset = ImageFolder(folder / "images", index_path=folder / f"index-{method}")
        dataset.set_error_policy(policy, quarantine=folder / f"quarantine-{method}.tsv")
        loader = DataLoaderX(dataset, batch_size=4, num_workers=2, worker_method=method, collate_fn=labels_only)
        try:
            return [labels for labels in loader], loader.stats()["bad_samples"]
        except Exception as error:  # noqa: BLE001 - the error is what is compared
            return type(error).__name__, "bad.jpg" in str(error)

    assert run("thread") == run("process")


def labels_only(samples: list[Any]) -> list[int]:
    return [int(label) for _, label in samples]


@pytest.mark.parametrize(("before", "after"), [("process", "thread"), ("thread", "process")])
def test_resume_across_modes(before: str, after: str) -> None:
    def loader(method: str) -> DataLoaderX[Any]:
        generator = torch.Generator().manual_seed(7)
        return DataLoaderX(
            Numbers(30), batch_size=3, shuffle=True, num_workers=2, worker_method=method, generator=generator
        )

    whole = [batch for batch in loader(before)]
    first = loader(before)
    iterator = iter(first)
    for _ in range(4):
        next(iterator)
    state = first.state_dict()
    del iterator
    resumed = loader(after)
    resumed.load_state_dict(state)
    rest = [batch for batch in resumed]
    assert [[t.tolist() for t in b] for b in rest] == [[t.tolist() for t in b] for b in whole[4:]]


class Slow(Numbers):
    def __getitem__(self, index: int) -> tuple[int, int]:
        if index == 0:
            time.sleep(3)  # far past the timeout: the wait, not its length, is what is checked
        return index, 0


def test_timeout_raises_as_torch() -> None:
    loader = DataLoaderX(Slow(4), batch_size=2, num_workers=1, worker_method="thread", timeout=0.2)
    with pytest.raises(RuntimeError, match="DataLoader timed out"):
        list(loader)


def test_the_arguments_are_checked() -> None:
    with pytest.raises(
        ValueError,
        match="worker_method must be one of 'process', 'thread', 'subprocess', 'ray' or a RayWorkers, got 'threads'",
    ):
        DataLoaderX(Numbers(), worker_method="threads")
    with pytest.raises(ValueError, match="multiprocessing_context has no use with worker_method='thread'"):
        DataLoaderX(Numbers(), num_workers=2, worker_method="thread", multiprocessing_context="spawn")


def test_num_workers_auto_measures_threads() -> None:
    loader = DataLoaderX(Numbers(64), batch_size=4, num_workers="auto", worker_method="thread")
    assert sorted(i for indices, _ in loader for i in indices.tolist()) == list(range(64))
    assert loader._runtime.autotune is not None and loader.num_workers >= 1
    assert multiprocessing.active_children() == []
    stages = loader.stats()["stages"]
    assert stages["collate"]["total_s"] > 0  # the stage clock timed the threads' collates
