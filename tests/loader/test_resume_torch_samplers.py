"""Resume of torch's own samplers: ``shuffle=True`` with torch's global seed or a ``generator``, torch's
SequentialSampler and DistributedSampler; torch's DataLoader is the reference for every order."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

from fastloader import DataLoaderX
from fastloader.samplers import TorchRandomSampler
from tests.loader.test_resume import Indices

EPOCH = 13  # batches of 4 in an epoch of 50


def epochs(loader: DataLoader[Any], count: int) -> list[list[list[int]]]:
    return [[batch.tolist() for batch in loader] for _ in range(count)]


def first(loader: DataLoader[Any], k: int) -> list[list[int]]:
    return [batch.tolist() for batch in itertools.islice(iter(loader), k)]


def reference(**kwargs: Any) -> list[list[list[int]]]:
    """Two epochs of torch's own DataLoader."""
    torch.manual_seed(1234)
    return epochs(DataLoader(Indices(), batch_size=4, **kwargs), 2)


@pytest.mark.parametrize("k", [0, 1, 5, 12])
@pytest.mark.parametrize(("workers_before", "workers_after"), [(0, 0), (0, 2), (2, 0)])
def test_shuffle_with_the_global_seed_resumes_torchs_order(k: int, workers_before: int, workers_after: int) -> None:
    expected = reference(shuffle=True)
    torch.manual_seed(1234)
    interrupted = DataLoaderX(Indices(), batch_size=4, shuffle=True, num_workers=workers_before)
    assert isinstance(interrupted.sampler, RandomSampler)  # frameworks still see torch's class
    assert first(interrupted, k) == expected[0][:k]  # parity with torch's loader for the same seed
    state = json.loads(json.dumps(interrupted.state_dict()))
    del interrupted

    torch.manual_seed(999)  # another global RNG: the state, not the process, decides the order
    resumed = DataLoaderX(Indices(), batch_size=4, shuffle=True, num_workers=workers_after)
    resumed.load_state_dict(state)
    rest = epochs(resumed, 1)[0]
    if k == 0:
        assert sorted(sum(rest, [])) == list(range(50))  # nothing delivered yet: any fresh order is the epoch
    else:
        assert rest == expected[0][k:]


def test_shuffle_with_the_global_seed_at_the_end_of_an_epoch_starts_the_next() -> None:
    torch.manual_seed(5)
    loader = DataLoaderX(Indices(), batch_size=4, shuffle=True)
    epochs(loader, 1)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"], state["start"]) == (1, 0, 0)
    resumed = DataLoaderX(Indices(), batch_size=4, shuffle=True)
    resumed.load_state_dict(state)
    assert sorted(sum(epochs(resumed, 1)[0], [])) == list(range(50))


@pytest.mark.parametrize("k", [0, 1, 5, 12, EPOCH])
@pytest.mark.parametrize(("workers_before", "workers_after"), [(0, 0), (2, 0), (0, 2)])
def test_shuffle_with_a_generator_resumes_and_continues_like_torch(
    k: int, workers_before: int, workers_after: int
) -> None:
    expected = reference(shuffle=True, generator=torch.Generator().manual_seed(3))
    interrupted = DataLoaderX(
        Indices(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3), num_workers=workers_before
    )
    assert first(interrupted, k) == expected[0][:k]
    state = json.loads(json.dumps(interrupted.state_dict()))
    del interrupted

    generator = torch.Generator().manual_seed(77)  # the state puts it back where the interrupted run had it
    resumed = DataLoaderX(Indices(), batch_size=4, shuffle=True, generator=generator, num_workers=workers_after)
    resumed.load_state_dict(state)
    # (k == EPOCH: after the last batch, the finished epoch resumes with nothing left, as torchdata's does)
    assert epochs(resumed, 2) == [expected[0][k:], expected[1]]  # and the next epoch follows as uninterrupted


def test_a_user_random_sampler_with_a_generator_resumes() -> None:
    def sampler() -> RandomSampler:
        return RandomSampler(Indices(), generator=torch.Generator().manual_seed(8))

    expected = [batch.tolist() for batch in DataLoader(Indices(), batch_size=4, sampler=sampler())]
    interrupted = DataLoaderX(Indices(), batch_size=4, sampler=sampler())
    assert first(interrupted, 4) == expected[:4]
    resumed = DataLoaderX(Indices(), batch_size=4, sampler=sampler())
    resumed.load_state_dict(interrupted.state_dict())
    assert epochs(resumed, 1)[0] == expected[4:]


def test_a_user_random_sampler_without_a_generator_cannot_resume() -> None:
    loader = DataLoaderX(Indices(), batch_size=4, sampler=RandomSampler(Indices()))
    state = loader.state_dict()  # always available (Lightning collects it)
    with pytest.raises(ValueError, match="generator"):
        loader.load_state_dict(state)


def test_sequential_order_resumes_without_a_seed() -> None:
    loader = DataLoaderX(Indices(), batch_size=4)
    assert first(loader, 3) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    resumed = DataLoaderX(Indices(), batch_size=4, num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    assert sum(epochs(resumed, 1)[0], []) == list(range(12, 50))


@pytest.mark.parametrize("drop_last", [False, True])
def test_torchs_distributed_sampler_resumes_on_each_rank(drop_last: bool) -> None:
    def loader(rank: int, workers: int = 0) -> DataLoaderX[Any]:
        sampler = DistributedSampler(Indices(), num_replicas=2, rank=rank, shuffle=True, seed=4, drop_last=drop_last)
        return DataLoaderX(Indices(), batch_size=4, sampler=sampler, num_workers=workers)

    for rank in (0, 1):
        uninterrupted = loader(rank)
        uninterrupted.set_epoch(2)
        expected = epochs(uninterrupted, 1)[0]
        interrupted = loader(rank)
        interrupted.set_epoch(2)
        assert first(interrupted, 2) == expected[:2]
        state = interrupted.state_dict()
        assert (state["world_size"], state["rank"], state["epoch"]) == (2, rank, 2)
        resumed = loader(rank, workers=2)
        resumed.load_state_dict(state)
        assert resumed.sampler.epoch == 2
        assert epochs(resumed, 1)[0] == expected[2:]


def test_torchs_distributed_sampler_cannot_resume_at_another_world_size() -> None:
    sampler = DistributedSampler(Indices(), num_replicas=2, rank=0)
    state = DataLoaderX(Indices(), batch_size=4, sampler=sampler).state_dict()
    other = DataLoaderX(Indices(), batch_size=4, sampler=DistributedSampler(Indices(), num_replicas=3, rank=0))
    with pytest.raises(ValueError, match="2 ranks"):
        other.load_state_dict(state)


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("with_generator", [False, True])
def test_the_sampler_is_torchs_draw_for_draw(replacement: bool, with_generator: bool) -> None:
    def run(cls: type[RandomSampler]) -> tuple[list[list[int]], float]:
        torch.manual_seed(11)
        generator = torch.Generator().manual_seed(2) if with_generator else None
        sampler = cls(range(30), replacement=replacement, num_samples=45, generator=generator)
        orders = [list(sampler) for _ in range(3)]
        return orders, torch.rand(1).item()  # and the global RNG is left where torch's sampler leaves it

    assert run(TorchRandomSampler) == run(RandomSampler)


def test_a_pinned_seed_orders_the_epoch_and_leaves_the_global_rng_as_torch_does() -> None:
    sampler = TorchRandomSampler(range(30))
    torch.manual_seed(0)
    first_order = list(sampler)
    seed = sampler.epoch_seed
    after_draw = torch.rand(1).item()
    torch.manual_seed(5)  # another global state: the pinned seed decides the order
    sampler.pin_next_seed(seed)
    assert list(sampler) == first_order
    torch.manual_seed(0)
    sampler.pin_next_seed(12345)
    list(sampler)
    assert torch.rand(1).item() == after_draw  # one draw consumed, as torch's sampler consumes


@pytest.mark.parametrize("k", [1, 5])
def test_a_batch_sampler_of_torchs_over_a_replayable_order_resumes(k: int) -> None:
    """batch_sampler=torch's BatchSampler: its batches follow its sampler's order, so the epoch is replayed
    whole batches at a time (accelerate's prepared loader reads its shard this way)."""

    def made(seed: int) -> DataLoaderX[Any]:
        order = RandomSampler(Indices(), generator=torch.Generator().manual_seed(seed))
        return DataLoaderX(Indices(), batch_sampler=BatchSampler(order, 4, False))

    expected = epochs(made(5), 2)
    interrupted = made(5)
    epochs(interrupted, 1)
    taken = first(interrupted, k)
    resumed = made(6)  # another seed: the order is the state's
    resumed.load_state_dict(json.loads(json.dumps(interrupted.state_dict())))
    assert taken + epochs(resumed, 1)[0] == expected[1]
