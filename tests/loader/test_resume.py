"""DataLoaderX.state_dict / load_state_dict and automatic epochs, in one process."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from fastloader import DataLoaderX
from fastloader.samplers import DistributedSampler, WeightedRandomSampler


class Indices(Dataset[int]):
    """Item i is i: batches show exactly which samples were delivered."""

    def __init__(self, length: int = 50) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


def batches(loader: DataLoaderX[Any], limit: int | None = None) -> list[Any]:
    """The batches of one ``iter()``: all of them, or the first ``limit`` (then the iterator is dropped)."""
    return [torch.as_tensor(batch).tolist() for batch in itertools.islice(iter(loader), limit)]


def loader_of(**kwargs: Any) -> DataLoaderX[Any]:
    options: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 3}
    options.update(kwargs)
    return DataLoaderX(Indices(options.pop("length", 50)), **options)


@pytest.mark.parametrize("k", [0, 1, 5, 13])  # 13 == len(loader): the epoch boundary
@pytest.mark.parametrize(("workers_before", "workers_after"), [(0, 0), (0, 2), (2, 0)])
def test_resume_gives_the_rest_of_the_uninterrupted_run(k: int, workers_before: int, workers_after: int) -> None:
    reference = loader_of()
    epoch0, epoch1 = batches(reference), batches(reference)  # automatic epochs: 0 then 1

    interrupted = loader_of(num_workers=workers_before)
    assert batches(interrupted, k) == epoch0[:k]
    state = json.loads(json.dumps(interrupted.state_dict()))  # plain data: survives JSON
    del interrupted

    resumed = loader_of(num_workers=workers_after)
    resumed.load_state_dict(state)
    # After the last batch, before the loop saw the end: the finished epoch resumes with nothing left
    # (torchdata's StatefulDataLoader does the same), then the next epoch follows.
    assert state["epoch"] == 0 and state["batches_yielded"] == k
    assert batches(resumed) == epoch0[k:]
    assert batches(resumed) == epoch1  # the next epoch follows, as in the uninterrupted run


def test_state_after_the_end_of_an_epoch_names_the_next_one() -> None:
    reference = loader_of()
    epoch0, epoch1 = batches(reference), batches(reference)
    loader = loader_of()
    assert batches(loader) == epoch0  # to the end: StopIteration reached
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (1, 0)
    resumed = loader_of()
    resumed.load_state_dict(state)
    assert batches(resumed) == epoch1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shuffle": False},
        {"drop_last": True, "batch_size": 7},
        {"batch_size": None},
        {"num_workers": 2, "persistent_workers": True},
        {"sampler": WeightedRandomSampler([1.0] * 25 + [3.0] * 25, 30, seed=5), "shuffle": None},
    ],
    ids=["sequential", "drop_last", "no_batching", "persistent_workers", "weighted"],
)
def test_resume_with_other_samplers(kwargs: dict[str, Any]) -> None:
    reference = loader_of(**kwargs)
    whole = batches(reference)
    k = len(whole) // 2
    interrupted = loader_of(**kwargs)
    batches(interrupted, k)
    state = interrupted.state_dict()
    resumed = loader_of(**kwargs)
    resumed.load_state_dict(state)
    assert batches(resumed) == whole[k:]


def test_drop_last_boundary_resumes_into_the_finished_epoch() -> None:
    loader = loader_of(batch_size=7, drop_last=True)  # 50 = 7 * 7 + 1: the last sample is dropped
    epoch0 = batches(loader, len(loader))
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (0, len(loader))
    resumed = loader_of(batch_size=7, drop_last=True)
    resumed.load_state_dict(state)
    assert batches(resumed) == []  # nothing left of epoch 0
    assert batches(resumed) != epoch0 and len(batches(loader_of(batch_size=7, drop_last=True))) == 7


def test_state_is_small_plain_data() -> None:
    loader = loader_of(length=100_000, batch_size=64)
    batches(loader, 3)
    state = loader.state_dict()
    assert state["rng"] == "" and state["sampler"] is None and state["after"] == []  # a seeded order needs no more
    assert state["workers"] is None  # no worker processes, a dataset without state of its own
    assert all(type(state[key]) is int for key in ("epoch", "samples_yielded", "batches_yielded", "seed", "start"))
    assert len(json.dumps(state)) < 400
    assert state["batches_yielded"] == 3 and state["samples_yielded"] == 192 and state["epoch"] == 0


def test_state_before_iterating_and_after_set_epoch() -> None:
    loader = loader_of()
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["samples_yielded"] == 0
    batches(loader, 2)
    loader.set_epoch(4)
    assert loader.state_dict()["epoch"] == 4 and loader.state_dict()["samples_yielded"] == 0


def test_automatic_epochs_change_the_order_and_are_reproducible() -> None:
    first, second = loader_of(), loader_of()
    runs = [[batches(loader) for _ in range(3)] for loader in (first, second)]
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1] != runs[0][2]
    assert runs[0] != [batches(loader_of(seed=4)) for _ in range(3)]
    for epoch in runs[0]:
        assert sorted(sum(epoch, [])) == list(range(50))


def test_explicit_set_epoch_wins() -> None:
    reference = loader_of()
    epochs = [batches(reference) for _ in range(3)]
    loader = loader_of()
    loader.set_epoch(2)
    assert batches(loader) == epochs[2]
    loader.set_epoch(0)
    assert batches(loader) == epochs[0]
    assert batches(loader) == epochs[1]  # automatic again: previous + 1


def test_set_epoch_after_load_keeps_the_loaded_position() -> None:
    reference = loader_of()
    whole = batches(reference)
    interrupted = loader_of()
    batches(interrupted, 4)
    state = interrupted.state_dict()
    resumed = loader_of()
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # what a training loop does at the top of the resumed epoch
    assert batches(resumed) == whole[4:]


def test_distributed_sampler_world_size_change_in_one_process() -> None:
    """Two ranks stop after k batches (lockstep); three ranks take the rest: nothing lost or repeated."""
    k, batch = 3, 4
    seen: list[int] = []
    states = []
    for rank in range(2):
        loader = DataLoaderX(Indices(), batch_size=batch, distributed=True, seed=1, shuffle=True)
        assert loader.sampler.num_replicas == 1  # no process group: a world of one
        loader = DataLoaderX(
            Indices(), batch_size=batch, sampler=DistributedSampler(50, num_replicas=2, rank=rank, seed=1)
        )
        seen += sum(batches(loader, k), [])
        states.append(loader.state_dict())
    assert states[0]["start"] == 0 and states[0]["world_size"] == 2
    rest: list[int] = []
    for rank in range(3):
        loader = DataLoaderX(
            Indices(), batch_size=batch, sampler=DistributedSampler(50, num_replicas=3, rank=rank, seed=1)
        )
        loader.load_state_dict(states[0])
        rest += sum(batches(loader), [])
    assert len(seen) == k * batch * 2
    padding = len(rest) - (50 - len(seen))
    assert 0 <= padding < 3
    assert sorted(set(seen + rest)) == list(range(50))
    assert len(set(seen) & set(rest)) == 0
    assert len(rest) - len(set(rest)) == padding


@pytest.mark.parametrize(
    "state",
    [
        [1, 2],
        {"epoch": 0},
        {**loader_of().state_dict(), "version": 99},
        {**loader_of().state_dict(), "rng": 5},
        {**loader_of().state_dict(), "rng": "not base64!"},
        {**loader_of().state_dict(), "epoch": -1},
        {**loader_of().state_dict(), "offset": 1},
    ],
)
def test_foreign_state_is_a_value_error(state: Any) -> None:
    with pytest.raises(ValueError):
        loader_of().load_state_dict(state)


def test_non_distributed_loader_rejects_a_distributed_state() -> None:
    state = {**loader_of().state_dict(), "world_size": 2, "layout": 2}
    with pytest.raises(ValueError, match="2 ranks"):
        loader_of().load_state_dict(state)


def test_bad_extras_are_value_errors() -> None:
    with pytest.raises(ValueError, match="distributed"):
        DataLoaderX(Indices(), distributed="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        DataLoaderX(Indices(), seed=-1)


def test_rebuild_from_attributes_keeps_the_chosen_sampler() -> None:
    """Lightning rebuilds as ``type(loader)(**attrs)``: shuffle=True comes back with our sampler."""
    loader = loader_of(distributed=True, seed=2)
    rebuilt = DataLoaderX(loader.dataset, batch_size=loader.batch_size, shuffle=loader.shuffle, sampler=loader.sampler)
    assert rebuilt.sampler is loader.sampler and rebuilt.shuffle is True
    assert batches(rebuilt) == batches(loader_of(distributed=True, seed=2))


def test_lightning_update_dataloader_with_our_distributed_sampler() -> None:
    lightning_data = pytest.importorskip("lightning.fabric.utilities.data")
    loader = loader_of(distributed=True, seed=2, num_workers=1)
    rebuilt = lightning_data._update_dataloader(loader, loader.sampler)
    assert type(rebuilt) is DataLoaderX and rebuilt.sampler is loader.sampler and rebuilt.seed == 2
    assert sorted(sum(batches(rebuilt), [])) == list(range(50))


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2), (2, 2), (1, 4), (4, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("position", [0, 12, 24, 48])
def test_distributed_remaining_indices_resplit_the_rest(old: int, new: int, drop_last: bool, position: int) -> None:
    layout = DistributedSampler(50, num_replicas=old, rank=0, seed=9, drop_last=drop_last)
    rest = layout.global_indices(1)[position:].tolist()
    parts = [
        DistributedSampler(50, num_replicas=new, rank=r, seed=9, drop_last=drop_last).remaining_indices(
            1, position, old
        )
        for r in range(new)
    ]
    assert len({len(part) for part in parts}) == 1  # equal parts: ranks stay in lockstep
    together = [i for part in zip(*parts) for i in part]
    if drop_last:
        assert together == rest[: len(rest) // new * new]
    else:
        assert together[: len(rest)] == rest and len(together) - len(rest) < new
    if old == new:
        assert parts[0].tolist() == layout.epoch_indices(1)[position // old :].tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_resumes_by_fast_forward(workers: int) -> None:
    """A dataset without a state of its own: each worker makes its first batches again, unsent."""
    from tests.toy_datasets import Counting

    whole = batches(DataLoaderX(Counting(), batch_size=3, num_workers=workers))
    loader = DataLoaderX(Counting(), batch_size=3, num_workers=workers)
    assert batches(loader, 5) == whole[:5]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["batches_yielded"] == 5
    resumed = DataLoaderX(Counting(), batch_size=3, num_workers=workers)
    resumed.load_state_dict(state)
    assert batches(resumed) == whole[5:]
    other = DataLoaderX(Counting(), batch_size=3, num_workers=1 if workers else 2)
    with pytest.raises(ValueError, match="same num_workers"):
        other.load_state_dict(state)


@pytest.mark.parametrize(("before", "after"), [(2, 1), (2, 3)])
def test_a_state_at_an_epochs_start_resumes_the_whole_epoch_laid_out_for_the_new_world(before: int, after: int) -> None:
    """A state taken after an epoch's end names the next epoch at its start: on another number of ranks that
    epoch is the uninterrupted run's at the new world size (21 samples over 1 rank: 21, not 2 ranks' 22)."""
    source = DataLoaderX(Indices(21), batch_size=5, sampler=DistributedSampler(21, num_replicas=before, rank=0, seed=1))
    list(source)
    state = json.loads(json.dumps(source.state_dict()))
    assert (state["epoch"], state["batches_yielded"]) == (1, 0)
    for rank in range(after):
        sampler = DistributedSampler(21, num_replicas=after, rank=rank, seed=1)
        resumed = DataLoaderX(Indices(21), batch_size=5, sampler=sampler)
        resumed.load_state_dict(state)
        uninterrupted = DistributedSampler(21, num_replicas=after, rank=rank, seed=1)
        uninterrupted.set_epoch(1)
        assert [i for batch in resumed for i in batch.tolist()] == list(uninterrupted)
