"""``worker_method="ray"`` on a real Ray cluster: a head and a second raylet (``ray start``, one CPU each, on
loopback), shared by this module. Two epochs with every sample once and the batches of ``"process"``, pixel for
pixel; an actor SIGKILLed mid-epoch and the second node stopped mid-epoch, nothing lost or doubled; a state saved
after k batches resumed in a new process, and in the other mode; a bad sample, a batch that kills its actors, a
cluster that cannot go on. (The lease book's own rules: tests/loader/test_lease_book.py, without Ray.)"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.errors import BatchKillsWorkers, WorkersLost
from fastloader.loader.workers.ray_options import RayWorkers
from tests.helpers import run_python, wait_until
from tests.images import write_image_folder
from tests.pack.ray_cluster import ENV as RAY_ENV
from tests.pack.ray_cluster import RayCluster
from tests.toy_datasets import Counting, Failing, KillsItsProcess, MadeBy

ray = pytest.importorskip("ray", reason="worker_method='ray' needs Ray (pip install fastloader[ray])")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in RAY_ENV.items():  # this process and the children it starts
            patch.setenv(name, value)
        started = RayCluster.start(tmp_path_factory.mktemp("ray-cache"))
        patch.setenv("RAY_ADDRESS", started.address)  # address="auto" in a child finds this cluster
        try:
            ray.init(address=started.address, log_to_driver=False)
            yield started
        finally:
            ray.shutdown()
            started.stop()


def _run(loader: DataLoaderX[Any], epochs: int = 1) -> list[list[tuple[Any, ...]]]:
    """Each epoch's batches, their tensors as lists."""
    out = []
    for _ in range(epochs):
        out.append([tuple(part.tolist() for part in batch) for batch in loader])
    return out


def _stopped(loader: DataLoaderX[Any]) -> None:
    """The loader's actors stopped now (the cluster's two CPUs go to the next test's)."""
    pool = loader._runtime.ray_pool
    if pool is not None:
        pool.stop()
    gc.collect()


def _labels(epoch: list[tuple[Any, ...]]) -> list[int]:
    return [label for batch in epoch for label in batch[1]]


def test_plain_import_never_imports_ray() -> None:
    done = run_python("import sys, fastloader; from fastloader import DataLoaderX; print('ray' in sys.modules)")
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"worker_method": "threads"}, "worker_method must be one of 'process', 'thread', 'subprocess', 'ray'"),
        ({"worker_method": "ray"}, "worker_method='ray' needs num_workers >= 1"),
        ({"worker_method": "ray", "num_workers": "auto"}, "worker_method='ray' needs num_workers >= 1"),
        ({"worker_method": "ray", "num_workers": 1, "batch_size": None}, "batch_size=None"),
        ({"worker_method": "ray", "num_workers": 1, "worker_init_fn": print}, "worker_init_fn"),
        ({"worker_method": "ray", "num_workers": 1, "ledger": "x.ledger"}, "ledger="),
        ({"worker_method": RayWorkers(), "num_workers": 1, "decode_on": "cuda"}, "decode_on='cuda'"),
    ],
)
def test_what_ray_workers_cannot_take_is_refused_naming_it(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DataLoaderX(MadeBy(4), **arguments)


def test_an_iterable_dataset_and_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="not an IterableDataset"):
        DataLoaderX(Counting(8), batch_size=2, num_workers=1, worker_method="ray")
    with pytest.raises(ValueError, match="num_cpus must be >= 0"):
        RayWorkers(num_cpus=-1)
    with pytest.raises(ValueError, match="placement_timeout must be > 0"):
        RayWorkers(placement_timeout=0)
    loader = DataLoaderX(MadeBy(4), num_workers=1, worker_method="ray")
    with pytest.raises(ValueError, match="worker_method attribute should not be set"):
        loader.worker_method = "process"


def test_two_epochs_every_sample_once_the_batches_of_process_mode(cluster: RayCluster) -> None:
    settings: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 5, "num_workers": 2}
    local = _run(DataLoaderX(MadeBy(30), **settings), epochs=2)
    loader = DataLoaderX(MadeBy(30), **settings, worker_method="ray")
    remote = _run(loader, epochs=2)
    _stopped(loader)
    for epoch in range(2):
        assert sorted(_labels(remote[epoch])) == list(range(30))
        assert [batch[:2] for batch in remote[epoch]] == [batch[:2] for batch in local[epoch]]  # pixels, labels
    assert _labels(remote[0]) != _labels(remote[1])  # a new order each epoch, as in process mode
    assert not {pid for epoch in remote for batch in epoch for pid in batch[2]} & {os.getpid()}  # made by actors


def test_an_image_folder_gives_process_modes_pixels_epoch_after_epoch(cluster: RayCluster, tmp_path: Path) -> None:
    """torch's own order (the global RNG), persistent workers: the later epochs' orders follow as torch's."""
    write_image_folder(tmp_path / "images", count=24)
    dataset = ImageFolder(tmp_path / "images", transform=T.Compose([T.Resize(40), T.CenterCrop(32)]))
    settings: dict[str, Any] = {"batch_size": 5, "shuffle": True, "num_workers": 2, "persistent_workers": True}
    torch.manual_seed(0)
    local_loader = DataLoaderX(dataset, **settings)
    local = [list(local_loader) for _ in range(2)]
    torch.manual_seed(0)
    loader = DataLoaderX(dataset, **settings, worker_method="ray")
    remote = [list(loader) for _ in range(2)]
    _stopped(loader)
    for epoch in range(2):
        assert len(remote[epoch]) == len(local[epoch]) == 5
        for (images, labels), (want_images, want_labels) in zip(remote[epoch], local[epoch], strict=True):
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
            assert torch.equal(labels, want_labels) and torch.equal(images, want_images), f"epoch {epoch}"
    stages = loader.stats()["stages"]
    assert stages["decode"]["total_s"] > 0 and stages["handoff"]["total_s"] > 0  # the actors' stages, timed


def test_random_crops_under_seed_are_process_and_thread_modes_pixel_for_pixel(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """seed=: each sample's crop and flip from (seed, epoch, index), whichever actor, worker or thread made it."""
    write_image_folder(tmp_path / "images", count=20)
    transform = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])
    dataset = ImageFolder(tmp_path / "images", transform=transform)
    settings: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 3, "num_workers": 2}
    runs = {}
    for method in ("process", "thread", "ray"):
        loader = DataLoaderX(dataset, **settings, worker_method=method)
        runs[method] = [[(images.clone(), labels.clone()) for images, labels in loader] for _ in range(2)]
        if method == "ray":
            _stopped(loader)
    for method in ("thread", "ray"):
        for epoch in range(2):
            for (images, labels), (want, want_labels) in zip(runs[method][epoch], runs["process"][epoch], strict=True):
                assert torch.equal(labels, want_labels) and torch.equal(images, want), f"{method}, epoch {epoch}"
    assert not torch.equal(runs["ray"][0][0][0], runs["ray"][1][0][0])  # another epoch, other crops


def test_a_bad_image_in_an_actor_follows_the_error_policy(cluster: RayCluster, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "images", count=11)
    (tmp_path / "images" / "class_0" / "bad.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    dataset = ImageFolder(tmp_path / "images", transform=T.Compose([T.Resize(40), T.CenterCrop(32)]))
    dataset.set_error_policy("skip")
    loader = DataLoaderX(dataset, batch_size=4, num_workers=1, worker_method="ray")
    labels = [label for _, batch_labels in loader for label in batch_labels.tolist()]
    _stopped(loader)
    assert len(labels) == 11  # the 12th sample left out, as in a worker process
    stats = loader.stats()
    assert stats["bad_samples"] == 1 and stats["by_reason"] == {"DecodeError": 1}  # the actor's quarantine line


def _kill_when_logged(log_dir: Path, count: int, killed: list[tuple[int, list[int]]]) -> None:
    """SIGKILL the first process that logged ``count`` indices (an actor mid-epoch)."""

    def logged() -> bool:
        for path in log_dir.glob("*.log"):
            indices = [int(line) for line in path.read_text().split()]
            if len(indices) >= count:
                killed.append((int(path.stem), indices))
                os.kill(int(path.stem), signal.SIGKILL)
                return True
        return False

    wait_until(logged, timeout=120)


def _made(log_dir: Path) -> dict[int, list[int]]:
    return {int(path.stem): [int(i) for i in path.read_text().split()] for path in log_dir.glob("*.log")}


def test_an_actor_killed_mid_epoch_loses_and_doubles_nothing(cluster: RayCluster, tmp_path: Path) -> None:
    settings: dict[str, Any] = {"batch_size": 3, "shuffle": True, "seed": 2, "num_workers": 2}
    want = _run(DataLoaderX(MadeBy(48), **settings))[0]
    log_dir = tmp_path / "made"
    log_dir.mkdir()
    loader = DataLoaderX(MadeBy(48, delay=0.05, log_dir=str(log_dir)), **settings, worker_method="ray")
    killed: list[tuple[int, list[int]]] = []
    killer = threading.Thread(target=_kill_when_logged, args=(log_dir, 10, killed))
    killer.start()
    try:
        got = _run(loader)[0]
    finally:
        killer.join()
    pool = loader._runtime.ray_pool
    assert pool is not None and pool.deaths == 1
    _stopped(loader)
    assert killed, "no actor was killed"
    labels = _labels(got)
    lost, doubled = set(range(48)) - set(labels), len(labels) - len(set(labels))
    assert (len(lost), doubled) == (0, 0)
    assert [batch[:2] for batch in got] == [batch[:2] for batch in want]  # the same batches, in order
    pid, before_death = killed[0]
    redone = [i for other, indices in _made(log_dir).items() if other != pid for i in indices]
    assert set(before_death[-1:]) <= set(redone)  # the lease it was making went to another actor


def test_a_state_saved_after_k_batches_resumes_exactly_in_a_new_process(cluster: RayCluster, tmp_path: Path) -> None:
    script = """
import json, sys, torch
from fastloader import DataLoaderX
from tests.toy_datasets import MadeBy
state_path, k = sys.argv[1], int(sys.argv[2])
loader = DataLoaderX(MadeBy(40), batch_size=4, shuffle=True, seed=9, num_workers=2, worker_method="ray")
labels = []
if k >= 0:
    for batch in loader:
        labels += batch[1].tolist()
        if len(labels) == 4 * k:
            torch.save(loader.state_dict(), state_path)
            break
else:
    loader.load_state_dict(torch.load(state_path, weights_only=False))
    labels = [label for batch in loader for label in batch[1].tolist()]
print(json.dumps(labels))
"""
    whole = _labels(_run(DataLoaderX(MadeBy(40), batch_size=4, shuffle=True, seed=9))[0])
    state = tmp_path / "state.pt"
    first = run_python(script, str(state), "3")
    assert first.returncode == 0, first.stderr[-3000:]
    rest = run_python(script, str(state), "-1")  # a new process, its own actors (RAY_ADDRESS: this cluster)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert json.loads(first.stdout) + json.loads(rest.stdout) == whole


@pytest.mark.parametrize(("saved_in", "loaded_in"), [("ray", "process"), ("process", "ray")])
def test_a_state_saved_in_one_mode_resumes_in_the_other(cluster: RayCluster, saved_in: str, loaded_in: str) -> None:
    settings: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 9, "num_workers": 2}
    whole = _run(DataLoaderX(MadeBy(40), **settings), epochs=2)
    first = DataLoaderX(MadeBy(40), **settings, worker_method=saved_in)
    before = _run(first)  # epoch 0 whole, then 3 batches of epoch 1
    iterator = iter(first)
    before.append([tuple(part.tolist() for part in next(iterator)) for _ in range(3)])
    state = first.state_dict()
    del iterator
    _stopped(first)
    second = DataLoaderX(MadeBy(40), **settings, worker_method=loaded_in)
    second.load_state_dict(state)
    rest = _run(second)[0]
    _stopped(second)
    assert [batch[:2] for batch in before[0]] == [batch[:2] for batch in whole[0]]
    assert [batch[:2] for batch in before[1] + rest] == [batch[:2] for batch in whole[1]]


def test_a_sample_that_raises_is_the_loops_error_at_its_batch_and_the_epoch_goes_on(cluster: RayCluster) -> None:
    loader = DataLoaderX(Failing(12, bad=5), batch_size=2, num_workers=1, worker_method="ray")
    iterator = iter(loader)
    got = [next(iterator).tolist(), next(iterator).tolist()]
    with pytest.raises(ValueError, match="bad sample 5"):
        next(iterator)
    got += [batch.tolist() for batch in iterator]
    _stopped(loader)
    assert got == [[0, 1], [2, 3], [6, 7], [8, 9], [10, 11]]


def test_a_batch_that_kills_its_actors_is_named(cluster: RayCluster) -> None:
    loader = DataLoaderX(KillsItsProcess(12, bad=7), batch_size=2, num_workers=1, worker_method="ray")
    iterator = iter(loader)
    got = [next(iterator).tolist() for _ in range(3)]
    with pytest.raises(BatchKillsWorkers, match=r"batch 3 of epoch 0 \(sample indices \[6, 7\]\)"):
        next(iterator)
    with pytest.raises(BatchKillsWorkers):  # no next() ends the epoch short as if it were whole
        next(iterator)
    _stopped(loader)
    assert got == [[0, 1], [2, 3], [4, 5]]


def test_a_cluster_that_cannot_go_on_raises_instead_of_hanging(cluster: RayCluster) -> None:
    too_big = DataLoaderX(
        MadeBy(8), batch_size=2, num_workers=1, worker_method=RayWorkers(num_cpus=8, placement_timeout=3)
    )
    with pytest.raises(
        WorkersLost, match=r"no actor of 1 could be placed and started within 3 s \(each asks for 8 CPUs"
    ):
        next(iter(too_big))
    _stopped(too_big)
    no_spare = DataLoaderX(
        MadeBy(12, delay=0.2), batch_size=2, num_workers=1, worker_method=RayWorkers(max_replacements=0)
    )
    iterator = iter(no_spare)
    next(iterator)
    pool = no_spare._runtime.ray_pool
    assert pool is not None and pool.actors[0] is not None and pool.actors[0].pid is not None
    os.kill(pool.actors[0].pid, signal.SIGKILL)
    with pytest.raises(WorkersLost, match="all 1 actors died and the 0 replacements allowed are spent"):
        list(iterator)
    _stopped(no_spare)


def test_the_second_node_stopped_mid_epoch_loses_and_doubles_nothing(cluster: RayCluster, tmp_path: Path) -> None:
    """Last in the module: the cluster has one node after it."""
    settings: dict[str, Any] = {"batch_size": 3, "shuffle": True, "seed": 4, "num_workers": 2}
    want = _run(DataLoaderX(MadeBy(48), **settings))[0]
    log_dir = tmp_path / "made"
    log_dir.mkdir()
    # Slow enough that either actor alone would take 12 s: both are at work when the node goes.
    loader = DataLoaderX(MadeBy(48, delay=0.25, log_dir=str(log_dir)), **settings, worker_method="ray")
    got, stopped_at = [], None
    for batch in loader:
        got.append(tuple(part.tolist() for part in batch))
        if stopped_at is None and len(_made(log_dir)) == 2:  # both actors at work (the loop consumes: they go on)
            cluster.stop_second_node()
            stopped_at = len(got)
    assert stopped_at is not None and stopped_at < 12, "the two actors were never at work together"
    pool = loader._runtime.ray_pool
    assert pool is not None and pool.deaths == 1
    _stopped(loader)
    labels = _labels(got)
    assert (len(set(range(48)) - set(labels)), len(labels) - len(set(labels))) == (0, 0)
    assert [batch[:2] for batch in got] == [batch[:2] for batch in want]
