"""fastloader.samplers: determinism in (seed, epoch), coverage, torch parity, weighting, resume, memory."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from fastloader.samplers import (
    DistributedSampler,
    RandomSampler,
    SamplerState,
    SequentialSampler,
    WeightedRandomSampler,
    class_balanced_weights,
)
from fastloader.samplers._epoch import index_dtype, permutation

SamplerFactory = Callable[[], "RandomSampler | SequentialSampler | DistributedSampler | WeightedRandomSampler"]


class _Indices(tud.Dataset[int]):
    """Item i is i: batches show exactly which indices the sampler produced."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


# --- RandomSampler ------------------------------------------------------------------------------


def test_random_is_a_function_of_seed_and_epoch() -> None:
    first, second = RandomSampler(1000, seed=7), RandomSampler(_Indices(1000), seed=7)
    assert list(first) == list(second)
    epoch0 = list(first)
    first.set_epoch(1)
    assert list(first) != epoch0
    assert list(RandomSampler(1000, seed=8)) != epoch0
    rng = np.random.Generator(np.random.PCG64([7, 0]))
    assert epoch0 == rng.permutation(1000).tolist()  # the documented definition


def test_random_yields_each_index_once_as_python_ints() -> None:
    sampler = RandomSampler(100_003, seed=1)
    sampler.set_epoch(3)
    items = list(sampler)
    assert len(items) == len(sampler) == 100_003
    assert all(type(item) is int for item in items[:1000])
    assert sorted(items) == list(range(100_003))


def test_permutation_in_int32_equals_numpy_permutation() -> None:
    for length in (0, 1, 17, 70_000):
        ours = permutation(np.random.Generator(np.random.PCG64([5, 2])), length)
        theirs = np.random.Generator(np.random.PCG64([5, 2])).permutation(length)
        assert ours.dtype == np.int32
        np.testing.assert_array_equal(ours, theirs)


def test_random_num_samples_and_replacement() -> None:
    more = RandomSampler(10, seed=2, num_samples=25).epoch_indices(0)
    assert len(more) == 25
    assert sorted(more[:10]) == sorted(more[10:20]) == list(range(10))  # whole permutations, then a part
    assert len(set(more[20:].tolist())) == 5
    fewer = RandomSampler(10, seed=2, num_samples=4)
    assert len(fewer) == 4 and len(set(fewer)) == 4
    drawn = RandomSampler(10, seed=2, replacement=True, num_samples=1000).epoch_indices(0)
    assert len(drawn) == 1000 and drawn.min() >= 0 and drawn.max() <= 9
    assert len(set(drawn.tolist())) == 10
    assert list(RandomSampler(0)) == []


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandomSampler(-1),
        lambda: RandomSampler(True),
        lambda: RandomSampler(object()),  # type: ignore[arg-type]
        lambda: RandomSampler(10, seed=-1),
        lambda: RandomSampler(10, num_samples=-2),
        lambda: RandomSampler(0, num_samples=3),
    ],
)
def test_random_rejects_bad_arguments(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        make()


def test_set_epoch_rejects_negative() -> None:
    with pytest.raises(ValueError, match="epoch"):
        RandomSampler(5).set_epoch(-1)


def test_sequential() -> None:
    sampler = SequentialSampler(_Indices(12))
    assert list(sampler) == list(range(12)) and len(sampler) == 12
    np.testing.assert_array_equal(sampler.epoch_indices(4), np.arange(12))
    assert sampler.epoch_indices(0).dtype == np.int32


# --- memory ---------------------------------------------------------------------------------


def test_ten_million_order_is_an_int32_array() -> None:
    order = RandomSampler(10_000_000, seed=0).epoch_indices(0)
    assert isinstance(order, np.ndarray) and order.dtype == np.int32
    assert order.nbytes == 40_000_000
    assert index_dtype(2**31) is np.int32 and index_dtype(2**31 + 1) is np.int64  # the int64 branch, unallocated


# --- DistributedSampler ---------------------------------------------------------------------


def _ranks(length: int, world: int, **kwargs: object) -> list[list[int]]:
    return [list(DistributedSampler(length, num_replicas=world, rank=rank, **kwargs)) for rank in range(world)]  # type: ignore[arg-type]


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("length", [1, 5, 23, 100])
def test_distributed_covers_the_epoch(world: int, length: int) -> None:
    parts = _ranks(length, world, seed=3)
    size = math.ceil(length / world)
    assert all(len(part) == size for part in parts)
    together = Counter(index for part in parts for index in part)
    assert set(together) == set(range(length))
    assert sum(together.values()) - length == size * world - length  # the documented padding, no more
    if length >= world:
        assert all(len(set(part)) == len(part) for part in parts)


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("length", [5, 23, 100])
def test_distributed_drop_last_is_disjoint(world: int, length: int) -> None:
    parts = _ranks(length, world, seed=3, drop_last=True)
    assert all(len(part) == length // world for part in parts)
    flat = [index for part in parts for index in part]
    assert len(flat) == len(set(flat)) == length // world * world


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("length", [1, 5, 23, 100])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_without_shuffle_equals_torch(world: int, length: int, drop_last: bool) -> None:
    for rank in range(world):
        ours = DistributedSampler(length, num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
        theirs: tud.DistributedSampler[int] = tud.DistributedSampler(
            _Indices(length), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last
        )
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)


def test_distributed_shuffle_is_the_random_order_split() -> None:
    # One global order for every world size: RandomSampler's. This is what lets resume change world size.
    single = DistributedSampler(23, num_replicas=1, rank=0, seed=4)
    single.set_epoch(2)
    reference = RandomSampler(23, seed=4).epoch_indices(2)
    assert list(single) == reference.tolist()
    parts = [DistributedSampler(23, num_replicas=3, rank=rank, seed=4).epoch_indices(2) for rank in range(3)]
    interleaved = np.stack(parts, axis=1).reshape(-1)
    np.testing.assert_array_equal(interleaved, np.resize(reference, 24))
    assert all(part.flags.c_contiguous for part in parts)


def test_distributed_changes_with_epoch() -> None:
    sampler = DistributedSampler(50, num_replicas=2, rank=1, seed=0)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first


@pytest.mark.parametrize("world, rank", [(2, 2), (2, -1), (0, 0), (3, 1.5)])
def test_distributed_rejects_bad_rank(world: int, rank: int) -> None:
    with pytest.raises(ValueError, match="rank|num_replicas"):
        DistributedSampler(10, num_replicas=world, rank=rank)


def test_distributed_defaults_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    sampler = DistributedSampler(10)
    assert (sampler.num_replicas, sampler.rank) == (4, 3)
    with pytest.raises(ValueError, match="rank must be"):
        DistributedSampler(10, num_replicas=2)  # RANK=3 does not fit 2 replicas
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        DistributedSampler(10)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    sampler = DistributedSampler(10)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)


# --- WeightedRandomSampler ------------------------------------------------------------------


def _chi_square(observed: np.ndarray, probabilities: np.ndarray) -> float:
    expected = probabilities * observed.sum()
    return float(((observed - expected) ** 2 / expected).sum())


def test_weighted_frequencies_follow_weights() -> None:
    weights = np.array([1.0, 2.0, 0.0, 3.0, 4.0, 0.5])
    sampler = WeightedRandomSampler(weights, 200_000, seed=11)
    drawn = sampler.epoch_indices(0)
    counts = np.bincount(drawn, minlength=weights.size)
    assert counts[2] == 0  # zero weight: never drawn
    positive = weights > 0
    # 5 classes, 4 degrees of freedom: P(chi2 > 30) is about 5e-6 for a correct sampler.
    assert _chi_square(counts[positive], weights[positive] / weights.sum()) < 30.0
    sampler.set_epoch(1)
    assert not np.array_equal(sampler.epoch_indices(1), drawn)
    np.testing.assert_array_equal(
        WeightedRandomSampler(torch.tensor(weights), 200_000, seed=11).epoch_indices(0), drawn
    )
    # Draws are sorted per chunk internally, then shuffled: the order must not show it.
    head = drawn[:100_000]
    assert 0.35 < np.mean(np.diff(head) > 0) < 0.375  # P(next > this) for i.i.d. draws here: 0.3628


def test_weighted_without_replacement() -> None:
    weights = np.array([5.0, 0.0, 1.0, 1.0, 3.0])
    every = WeightedRandomSampler(weights, 4, replacement=False, seed=1)
    assert sorted(every) == [0, 2, 3, 4]
    with pytest.raises(ValueError, match="without replacement"):
        WeightedRandomSampler(weights, 5, replacement=False)
    # The first draw of an epoch picks i with probability w_i / sum(w).
    sampler = WeightedRandomSampler(weights, 2, replacement=False, seed=2)
    firsts = np.bincount([sampler.epoch_indices(epoch)[0] for epoch in range(4000)], minlength=5)
    assert firsts[1] == 0
    assert _chi_square(firsts[weights > 0], weights[weights > 0] / weights.sum()) < 30.0


@pytest.mark.parametrize("weights", [[], [1.0, -1.0], [0.0, 0.0], [1.0, float("nan")], [[1.0, 2.0]]])
def test_weighted_rejects_bad_weights(weights: list[float]) -> None:
    with pytest.raises(ValueError, match="weights"):
        WeightedRandomSampler(weights, 3)


def test_class_balanced_weights() -> None:
    labels = np.array([0, 0, 0, 0, 1, 2, 2, 0, 1, 0])
    weights = class_balanced_weights(labels)
    assert weights.dtype == np.float64 and weights.shape == labels.shape
    sums = [weights[labels == label].sum() for label in (0, 1, 2)]
    np.testing.assert_allclose(sums, [1 / 3] * 3)
    np.testing.assert_allclose(class_balanced_weights(["cat", "dog", "dog"]), [0.5, 0.25, 0.25])
    assert class_balanced_weights(np.array([], dtype=np.int64)).size == 0
    with pytest.raises(ValueError, match="one-dimensional"):
        class_balanced_weights(np.zeros((2, 2)))
    drawn = WeightedRandomSampler(weights, 200_000, seed=5).epoch_indices(0)
    per_class = np.bincount(labels[drawn], minlength=3)
    assert _chi_square(per_class, np.full(3, 1 / 3)) < 30.0


# --- resume -----------------------------------------------------------------------------------

FACTORIES: dict[str, SamplerFactory] = {
    "random": lambda: RandomSampler(1000, seed=9),
    "random-replacement": lambda: RandomSampler(1000, seed=9, replacement=True, num_samples=300),
    "sequential": lambda: SequentialSampler(1000),
    "distributed": lambda: DistributedSampler(1001, num_replicas=3, rank=2, seed=9),
    "weighted": lambda: WeightedRandomSampler(np.linspace(0.1, 1.0, 1000), 700, seed=9),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
@pytest.mark.parametrize("taken", [0, 1, 200])
def test_resume_continues_the_epoch(name: str, taken: int) -> None:
    make = FACTORIES[name]
    original = make()
    original.set_epoch(5)
    whole = list(original)
    iterator = iter(original)
    head = [next(iterator) for _ in range(taken)]
    state = json.loads(json.dumps(original.state_dict()))  # plain data
    assert state == {"epoch": 5, "seed": 0 if name == "sequential" else 9, "offset": taken}

    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(5)  # what a training loop does at the top of the resumed epoch: keeps the offset
    assert head + list(resumed) == whole
    assert list(resumed) == whole  # later iterations start at 0
    resumed.set_epoch(6)
    original.set_epoch(6)
    assert list(resumed) == list(original)


def test_resume_details() -> None:
    sampler = RandomSampler(10, seed=1)
    assert sampler.state_dict() == {"epoch": 0, "seed": 1, "offset": 0}
    list(sampler)
    assert sampler.state_dict()["offset"] == 10  # a finished epoch
    sampler.load_state_dict({"epoch": 2, "seed": 4, "offset": 3})
    assert (sampler.epoch, sampler.seed) == (2, 4)
    sampler.set_epoch(3)  # another epoch: the loaded offset no longer applies
    assert len(list(sampler)) == 10
    stale = iter(sampler)
    next(stale)
    fresh = iter(sampler)
    next(stale)  # an older iterator does not move the newer one's state
    assert sampler.state_dict()["offset"] == 0
    next(fresh)
    assert sampler.state_dict()["offset"] == 1
    assert SamplerState.from_dict({"epoch": 1, "seed": 2, "offset": 3}).to_dict() == {
        "epoch": 1,
        "seed": 2,
        "offset": 3,
    }


@pytest.mark.parametrize(
    "state",
    [
        {"epoch": 0, "seed": 0},
        {"epoch": 0, "seed": 0, "offset": 0, "extra": 1},
        {"epoch": -1, "seed": 0, "offset": 0},
        {"epoch": 0, "seed": 0, "offset": 11},
        {"epoch": 0, "seed": 0, "offset": 1.0},
        [("epoch", 0)],
    ],
)
def test_load_rejects_bad_state(state: object) -> None:
    with pytest.raises(ValueError, match="state"):
        RandomSampler(10).load_state_dict(state)  # type: ignore[arg-type]


# --- inside torch's DataLoader ------------------------------------------------------------------


def _batches(sampler: tud.Sampler[int], num_workers: int) -> list[list[int]]:
    loader = tud.DataLoader(_Indices(500), batch_size=16, sampler=sampler, num_workers=num_workers)
    return [batch.tolist() for batch in loader]


def test_dataloader_batches_do_not_depend_on_workers() -> None:
    for make in (
        lambda: RandomSampler(500, seed=3),
        lambda: DistributedSampler(500, num_replicas=2, rank=1, seed=3),
        lambda: WeightedRandomSampler(np.ones(500), 250, seed=3),
    ):
        serial, parallel = make(), make()
        serial.set_epoch(2)
        parallel.set_epoch(2)
        expected = _batches(serial, 0)
        assert _batches(parallel, 2) == expected
        assert [index for batch in expected for index in batch] == serial.epoch_indices(2).tolist()
