"""A state saved at one batch_size and loaded into a loader with another resumes at the same SAMPLE: every
sample of the epoch's order not yet received, once each, in order, at the new batch size; where that
cannot be exact (drop_last, batches received out of order, an IterableDataset replayed) a ValueError
says so. The expected orders are computed directly from what decides them (torch's and fastloader's
samplers); torchdata's StatefulDataLoader, where installed, is checked to agree."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.utils.data as tud
from torch.utils.data import Dataset, IterableDataset

from fastloader import DataLoaderX
from fastloader.samplers import DistributedSampler, RandomSampler, ShardWindowSampler, WeightedRandomSampler

LENGTH, SAVED_BATCH, K = 50, 4, 3  # the run stops after K batches of SAVED_BATCH: 12 samples of 50
ORDERS = ["generator", "global_seed", "seed", "sequential", "random_sampler", "weighted", "shard_window"]
SHARDS = [0, 7, 20, 26, 41, LENGTH]  # ShardWindowSampler's shard starts


class Indices(Dataset[int]):
    """Item i is i: the batches show exactly which samples were delivered."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> int:
        return index


def options(order: str) -> dict[str, Any]:
    if order == "generator":
        return {"shuffle": True, "generator": torch.Generator().manual_seed(7)}
    if order == "global_seed":
        return {"shuffle": True}
    if order == "seed":
        return {"shuffle": True, "seed": 3}
    if order == "random_sampler":
        return {"sampler": tud.RandomSampler(Indices(), generator=torch.Generator().manual_seed(9))}
    if order in ("weighted", "shard_window"):
        return {"sampler": fastloader_sampler(order)}
    return {}


def fastloader_sampler(order: str, rank: int = 0, world: int = 1) -> Any:
    if order == "weighted":
        return WeightedRandomSampler([1.0 + i % 5 for i in range(LENGTH)], LENGTH, seed=2)
    if order == "shard_window":
        return ShardWindowSampler(SHARDS, window=2, seed=4, num_replicas=world, rank=rank)
    return DistributedSampler(LENGTH, num_replicas=world, rank=rank, seed=1)


def expected_order(order: str) -> list[int]:
    """Epoch 0's order, from what decides it (torch draws the workers' base seed before the order)."""
    if order == "generator":
        generator = torch.Generator().manual_seed(7)
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the workers' base seed
        return torch.randperm(LENGTH, generator=generator).tolist()
    if order == "global_seed":
        torch.manual_seed(0)
        torch.empty((), dtype=torch.int64).random_()  # the workers' base seed
        seed = int(torch.empty((), dtype=torch.int64).random_().item())  # torch's RandomSampler's draw
        return torch.randperm(LENGTH, generator=torch.Generator().manual_seed(seed)).tolist()
    if order == "seed":
        return list(RandomSampler(LENGTH, seed=3))
    if order == "random_sampler":
        return torch.randperm(LENGTH, generator=torch.Generator().manual_seed(9)).tolist()
    if order in ("weighted", "shard_window"):
        return list(fastloader_sampler(order))
    return list(range(LENGTH))


def samples(loader: Any, limit: int | None = None) -> tuple[list[int], list[int]]:
    """The samples of one ``iter()`` (of its first ``limit`` batches), and the size of each batch."""
    got = [torch.as_tensor(batch).tolist() for batch in itertools.islice(iter(loader), limit)]
    return [x for batch in got for x in batch], [len(batch) for batch in got]


def interrupted(make: Any, order: str, plain: bool = True) -> tuple[list[int], dict[str, Any]]:
    """K batches of SAVED_BATCH, then the state (through JSON, as a checkpoint keeps it, if ``plain``)."""
    torch.manual_seed(0)
    loader = make(SAVED_BATCH, 0, options(order))
    head, _ = samples(loader, K)
    state = loader.state_dict()
    return head, json.loads(json.dumps(state)) if plain else copy.deepcopy(state)


def make_x(batch: int, workers: int, kwargs: dict[str, Any]) -> DataLoaderX[Any]:
    return DataLoaderX(Indices(), batch_size=batch, num_workers=workers, **kwargs)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch", [8, 3, 2])
@pytest.mark.parametrize("order", ORDERS)
def test_a_state_resumes_at_the_same_sample_at_another_batch_size(order: str, batch: int, workers: int) -> None:
    expected = expected_order(order)
    head, state = interrupted(make_x, order)
    assert head == expected[: K * SAVED_BATCH]
    resumed = make_x(batch, workers, options(order))
    resumed.load_state_dict(state)
    rest, sizes = samples(resumed)
    assert rest == expected[K * SAVED_BATCH :]  # 38 samples: none lost, none repeated, in order
    assert (state["samples_yielded"], state["batch_size"]) == (K * SAVED_BATCH, SAVED_BATCH)
    assert sizes == [batch] * (len(rest) // batch) + ([len(rest) % batch] if len(rest) % batch else [])


@pytest.mark.parametrize("order", ORDERS)
def test_torchdatas_stateful_dataloader_agrees(order: str) -> None:
    """The control (where torchdata is installed): StatefulDataLoader too resumes the 38 samples of its own
    epoch order (with a random order not torch's draw for draw: its sampler is its own)."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    if order in ("seed", "weighted", "shard_window"):
        pytest.skip("fastloader's own order")

    def make(batch: int, workers: int, kwargs: dict[str, Any]) -> Any:
        return stateful.StatefulDataLoader(Indices(), batch_size=batch, num_workers=workers, **kwargs)

    torch.manual_seed(0)
    their_order, _ = samples(make(SAVED_BATCH, 0, options(order)))
    _, theirs = interrupted(make, order, plain=False)  # torchdata's state holds tensors
    control = make(8, 0, options(order))  # torchdata resumes only into the same num_workers
    control.load_state_dict(theirs)
    _, ours = interrupted(make_x, order)
    resumed = make_x(8, 2, options(order))
    resumed.load_state_dict(ours)
    assert samples(control)[0] == their_order[K * SAVED_BATCH :]
    assert samples(resumed)[0] == expected_order(order)[K * SAVED_BATCH :]
    if order in ("sequential", "random_sampler"):  # the same order
        assert their_order == expected_order(order)


def test_a_resumed_state_saved_again_at_a_third_batch_size_goes_on() -> None:
    expected = expected_order("seed")
    _, state = interrupted(make_x, "seed")
    second = make_x(8, 2, options("seed"))
    second.load_state_dict(state)
    middle, _ = samples(second, 2)
    state = json.loads(json.dumps(second.state_dict()))
    third = make_x(3, 0, options("seed"))
    third.load_state_dict(state)
    assert middle + samples(third)[0] == expected[12:]
    assert state["samples_yielded"] == 12 + 16


@pytest.mark.parametrize("kind", ["distributed", "torch", "shard_window"])
@pytest.mark.parametrize("batch", [8, 3])
def test_two_ranks_resume_at_another_batch_size(batch: int, kind: str) -> None:
    """Each rank of two (lockstep) resumes its own part at the sample it reached."""

    def sampler_of(rank: int) -> Any:
        if kind == "torch":
            sampler = tud.DistributedSampler(Indices(), num_replicas=2, rank=rank, seed=1)
            sampler.set_epoch(0)
            return sampler
        return fastloader_sampler(kind, rank, 2)

    for rank in range(2):
        part = list(sampler_of(rank))  # this rank's order: 25 samples
        loader = DataLoaderX(Indices(), batch_size=SAVED_BATCH, sampler=sampler_of(rank), num_workers=2)
        head, _ = samples(loader, K)
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = DataLoaderX(Indices(), batch_size=batch, sampler=sampler_of(rank), num_workers=2)
        resumed.load_state_dict(state)
        assert head + samples(resumed)[0] == part  # 12 before, the 13 left after
        assert state["samples_yielded"] == K * SAVED_BATCH


def test_another_world_size_and_batch_size_lose_and_repeat_nothing() -> None:
    """Two ranks stop after K batches of 4; three ranks at batch_size 5 take the rest of the epoch."""
    seen: list[int] = []
    states = []
    for rank in range(2):
        loader = DataLoaderX(Indices(), batch_size=SAVED_BATCH, sampler=DistributedSampler(LENGTH, 2, rank, seed=1))
        seen += samples(loader, K)[0]
        states.append(loader.state_dict())
    order = DistributedSampler(LENGTH, 2, 0, seed=1).global_indices(0).tolist()
    assert sorted(seen) == sorted(order[: 2 * K * SAVED_BATCH])
    rest: list[int] = []
    for rank in range(3):
        loader = DataLoaderX(Indices(), batch_size=5, sampler=DistributedSampler(LENGTH, 3, rank, seed=1))
        loader.load_state_dict(states[rank % 2])
        rest += samples(loader)[0]
    left = order[2 * K * SAVED_BATCH :]  # 26 samples, split 9 / 9 / 8 and padded by one
    assert sorted(rest) == sorted(left + left[:1])


def test_a_state_of_the_previous_version_resumes_at_the_same_sample() -> None:
    """Version 3 had no batch_size: samples_yielded / batches_yielded gives it."""
    expected = expected_order("seed")
    _, state = interrupted(make_x, "seed")
    old = {key: value for key, value in state.items() if key not in ("batch_size", "dataset", "next_rng")}
    old["version"] = 3
    resumed = make_x(8, 0, options("seed"))
    resumed.load_state_dict(old)
    assert samples(resumed)[0] == expected[12:]


def test_drop_last_with_another_batch_size_is_refused_where_other_samples_would_be_dropped() -> None:
    _, state = interrupted(lambda b, w, kw: make_x(b, w, {**kw, "drop_last": True}), "seed")
    resumed = make_x(8, 0, {**options("seed"), "drop_last": True})
    with pytest.raises(ValueError, match=r"batch_size=4 with drop_last=True.*resume with batch_size=4"):
        resumed.load_state_dict(state)
    same_tail = make_x(2, 0, {**options("seed"), "drop_last": True})  # 38 left: 2 dropped at 4, 0 at 2
    with pytest.raises(ValueError, match="drop_last"):
        same_tail.load_state_dict(state)
    at_the_saved_size = make_x(4, 0, {**options("seed"), "drop_last": True})
    at_the_saved_size.load_state_dict(state)
    assert samples(at_the_saved_size)[0] == expected_order("seed")[12:48]


def test_batches_received_out_of_order_at_another_batch_size_are_refused() -> None:
    _, state = interrupted(make_x, "seed")
    state["after"] = [1]  # with in_order=False, the batch after the next one had arrived too
    resumed = make_x(8, 0, options("seed"))
    with pytest.raises(ValueError, match=r"in_order=False.*resume it with batch_size=4"):
        resumed.load_state_dict(state)


class Counting(IterableDataset[int]):
    """0, 1, 2, ...: no state of its own, so a resume makes its batches again."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(LENGTH))


def test_an_iterable_dataset_without_state_at_another_batch_size_is_refused() -> None:
    loader = DataLoaderX(Counting(), batch_size=SAVED_BATCH)
    samples(loader, K)
    state = loader.state_dict()
    resumed = DataLoaderX(Counting(), batch_size=8)
    with pytest.raises(ValueError, match=r"Counting.*resume with batch_size=4"):
        resumed.load_state_dict(state)
