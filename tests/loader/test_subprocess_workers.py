"""worker_method="subprocess": one child process runs the whole pipeline (the thread workers, collate, the batch
ring's writes) and gives what worker processes give (fastloader.loader.workers.subprocess)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fastloader import DataLoaderX
from fastloader.datasets import ImageFolder
from fastloader.errors import PipelineLost
from tests.helpers import pid_alive, run_python, wait_until
from tests.images import write_image_folder
from tests.loader.test_batch_ring import TRAIN, Reference, in_ring, photos
from tests.loader.worker_datasets import Numbers, Raising, Sharded

MODES = ("process", "thread", "subprocess")


class Where(Numbers):
    """Sample i: i and the pid of the process that made it."""

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, os.getpid()


class SlowAfterFirst(Numbers):
    """Batches after the first take long: the test kills the pipeline while the loop waits for one."""

    def __getitem__(self, index: int) -> tuple[int, int]:
        if index >= 2:
            time.sleep(0.5)
        return index, os.getpid()


def _descendants() -> set[int]:
    """Every process below this one (the fork server and what it forked included), from /proc."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii") as stat:
                    parents[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
        found |= frontier
    return {pid for pid in found if pid_alive(pid)}


def _batches(loader: DataLoaderX[Any]) -> list[Any]:
    return [b.tolist() if isinstance(b, torch.Tensor) else [t.tolist() for t in b] for b in loader]


def test_exactly_one_child_process_runs_the_workers() -> None:
    list(DataLoaderX(Numbers(4), batch_size=2, num_workers=1, worker_method="subprocess"))  # the fork server is up
    before = _descendants()
    loader = DataLoaderX(Where(24), batch_size=2, num_workers=3, worker_method="subprocess")
    iterator = iter(loader)
    batches = [next(iterator) for _ in range(4)]
    new = _descendants() - before
    workers = iterator._source._workers  # torch's iterator under the producer thread
    assert len(new) == 1 and {worker.pid for worker in workers} == new  # three workers, one process
    assert {pid for _, pids in batches for pid in pids.tolist()} == new
    rest = list(iterator)
    assert sorted(i for _, (indices, _) in enumerate(batches + rest) for i in indices.tolist()) == list(range(24))
    assert wait_until(lambda: not (_descendants() - before), timeout=30)  # gone with its epoch


def test_thread_mode_starts_no_process_and_process_mode_one_each() -> None:
    list(DataLoaderX(Numbers(4), batch_size=2, num_workers=1, worker_method="subprocess"))
    for method, expected in (("thread", 0), ("process", 3)):
        before = _descendants()
        iterator = iter(DataLoaderX(Where(12), batch_size=2, num_workers=3, worker_method=method))
        next(iterator)
        assert len(_descendants() - before) == expected, method
        del iterator


@pytest.mark.parametrize("case", ["map", "sharded", "in_order=False"])
def test_batches_are_the_other_modes(case: str) -> None:
    def run(method: str) -> list[Any]:
        torch.manual_seed(5)
        args: dict[str, Any] = {"batch_size": 3, "num_workers": 2, "worker_method": method}
        if case == "map":
            dataset: Any = Numbers(25)
            args["shuffle"] = True
        elif case == "in_order=False":
            dataset, args["in_order"] = Numbers(25), False
        else:
            dataset = Sharded(3, 20)
        batches = _batches(DataLoaderX(dataset, **args))
        if case == "in_order=False":  # batches as they are finished, by whichever worker: the same samples
            return sorted(b[0] for b in batches)
        return batches

    runs = {method: run(method) for method in MODES}
    assert runs["subprocess"] == runs["process"] == runs["thread"]


def _train_batches(
    method: str, bad: frozenset[int] = frozenset()
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int, dict[str, Any] | None]:
    """Two epochs of random crops (cloned), how many batches viewed the batch ring, and its stats; ``bad``
    samples are corrupt and skipped."""
    torch.manual_seed(5)  # the workers' seeds: torch's base seed, from the global generator
    dataset = photos(40, TRAIN, corrupt=bad)
    if bad:
        dataset.set_error_policy("skip")
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=3, num_workers=2, worker_method=method)
    batches, viewed = [], 0
    for _ in range(2):
        for images, labels in loader:
            viewed += in_ring(loader, images)
            batches.append((images.clone(), labels.clone()))
    return batches, viewed, loader.stats()["batch_ring"]


@pytest.mark.parametrize("bad", [frozenset(), frozenset({5, 17})], ids=["good", "bad samples skipped"])
@pytest.mark.parametrize("method", ["subprocess", "thread"])
def test_random_crops_are_process_modes(method: str, bad: frozenset[int]) -> None:
    """fastloader's transforms draw from a thread worker's own generator: the same crops as worker processes, also
    where a batch with a bad sample is decoded again image by image (its draws made again)."""
    expected, _, _ = _train_batches("process", bad)
    got, _, _ = _train_batches(method, bad)
    pairs = zip(expected, got, strict=True)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in pairs)


def test_image_batches_cross_through_the_batch_ring() -> None:
    """fastloader's decoded batches are written into ring slots in the child and arrive as views of them, every
    pixel as a fresh decode gives it."""
    _, viewed, stats = _train_batches("subprocess")
    assert stats is not None and viewed == 20 and stats["fresh"] == 0 and stats["reused"] == 20
    dataset = photos(40)
    reference = Reference(dataset)
    for images, labels in DataLoaderX(dataset, batch_size=4, shuffle=True, num_workers=2, worker_method="subprocess"):
        reference.check(images, labels)


def test_a_dataset_exception_is_raised_with_its_traceback_and_worker() -> None:
    loader = DataLoaderX(Raising(12), batch_size=2, num_workers=2, worker_method="subprocess")
    with pytest.raises(KeyError, match="sample 7 is broken") as error:
        list(loader)
    text = str(error.value)
    assert "in DataLoader worker thread 1 of the worker_method='subprocess' pipeline" in text  # batch 3 is worker 1's
    assert "Original Traceback" in text and "in __getitem__" in text and 'raise KeyError(f"sample' in text


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    write_image_folder(tmp_path / "images", count=12)
    (tmp_path / "images" / "class_0" / "bad.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return tmp_path


def labels_only(samples: list[Any]) -> list[int]:
    return [int(label) for _, label in samples]


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

    assert run("subprocess") == run("process")


@pytest.mark.parametrize(
    ("before", "after"), [("process", "subprocess"), ("subprocess", "process"), ("subprocess", "thread")]
)
def test_resume_across_modes(before: str, after: str) -> None:
    def loader(method: str) -> DataLoaderX[Any]:
        generator = torch.Generator().manual_seed(7)
        return DataLoaderX(
            Numbers(30), batch_size=3, shuffle=True, num_workers=2, worker_method=method, generator=generator
        )

    whole = _batches(loader(before))
    first = loader(before)
    iterator = iter(first)
    for _ in range(4):
        next(iterator)
    state = first.state_dict()
    del iterator
    resumed = loader(after)
    resumed.load_state_dict(state)
    assert _batches(resumed) == whole[4:]


def test_persistent_pipeline_serves_three_epochs_from_one_process() -> None:
    loader = DataLoaderX(Where(12), batch_size=2, num_workers=2, worker_method="subprocess", persistent_workers=True)
    pids = []
    for _ in range(3):
        seen = [batch for batch in loader]
        assert sorted(i for indices, _ in seen for i in indices.tolist()) == list(range(12))
        pids.append({pid for _, where in seen for pid in where.tolist()})
    assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 1 and os.getpid() not in pids[0]


@pytest.mark.timeout(120)  # a guard against the hang this rules out: the error comes within seconds
def test_a_killed_pipeline_is_a_clear_error_not_a_hang() -> None:
    loader = DataLoaderX(SlowAfterFirst(40), batch_size=2, num_workers=2, worker_method="subprocess")
    iterator = iter(loader)
    _, where = next(iterator)
    pid = int(where[0])
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(
        PipelineLost,
        match=rf"worker_method='subprocess' pipeline process \(pid {pid}\) died \(killed by signal SIGKILL\)",
    ):
        for _ in iterator:
            pass


def test_the_pipeline_dies_with_the_training_process() -> None:
    script = textwrap.dedent(
        """
        import os, signal
        from fastloader import DataLoaderX
        from tests.loader.test_subprocess_workers import Where

        if __name__ == "__main__":
            iterator = iter(DataLoaderX(Where(400), batch_size=2, num_workers=2, worker_method="subprocess"))
            _, where = next(iterator)
            print(int(where[0]), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up of any kind runs
        """
    )
    done = run_python(f"exec({script!r})")
    assert done.returncode == -signal.SIGKILL, done.stderr
    pid = int(done.stdout.split()[0])
    assert wait_until(lambda: not pid_alive(pid), timeout=30), f"pipeline {pid} outlived the training process"


def test_the_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="worker_method must be one of 'process', 'thread', 'subprocess', 'ray'"):
        DataLoaderX(Numbers(), worker_method="subprocesses")
    assert (
        sys.platform != "linux"
        or DataLoaderX(
            Numbers(), num_workers=1, worker_method="subprocess", multiprocessing_context="spawn"
        ).multiprocessing_context
        is not None
    )
