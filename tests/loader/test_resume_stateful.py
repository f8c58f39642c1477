"""Resume of what holds its own state (torchdata's StatefulDataLoader contract): samplers and datasets with
``state_dict`` / ``load_state_dict``, IterableDatasets per worker, the workers' random generators, and
states taken at position 0 and at the end of an epoch."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from fastloader import DataLoaderX


class Shards(IterableDataset[int]):
    """Worker w yields w*100, w*100+1, ...; its position is its own state (``state_dict``)."""

    def __init__(self, per_worker: int = 12) -> None:
        self.per_worker = per_worker
        self.position = 0
        self.resume_at = 0

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        self.position, self.resume_at = self.resume_at, 0
        while self.position < self.per_worker:
            self.position += 1
            yield worker * 100 + self.position - 1

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at = state["position"]


class Noisy(Dataset[float]):
    """Each item draws from the worker's torch generator: the worker's random state decides the value."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> float:
        return float(torch.rand(()).item()) + index


class Stepping(Sampler[int]):
    """A sampler whose position is its own state (torchdata's GeneratorSampler pattern)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.position = 0
        self.resume_at = 0

    def __iter__(self) -> Iterator[int]:
        self.position, self.resume_at = self.resume_at, 0
        while self.position < self.length:
            self.position += 1
            yield (self.position * 7) % self.length

    def __len__(self) -> int:
        return self.length

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at = state["position"]


def run(loader: DataLoaderX[Any], limit: int | None = None) -> list[Any]:
    return [batch.tolist() for batch in itertools.islice(iter(loader), limit)]


def interrupted_and_resumed(make: Any, k: int) -> tuple[list[Any], list[Any]]:
    """The uninterrupted epoch, and k batches + the rest after a resume in a new loader (state through JSON)."""
    whole = run(make())
    loader = make()
    head = run(loader, k)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    return whole, head + run(resumed)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [0, 3, 7])
def test_iterable_dataset_resumes_from_each_workers_own_state(workers: int, k: int) -> None:
    whole, resumed = interrupted_and_resumed(lambda: DataLoaderX(Shards(), batch_size=2, num_workers=workers), k)
    # k past the epoch's end (6 batches without workers): the state names the next epoch, delivered whole,
    # as the uninterrupted run's second epoch (the dataset starts its data again at each iter())
    assert resumed == (whole if k < len(whole) else whole + whole)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_sampler_has_its_state_saved_and_restored(workers: int) -> None:
    def make() -> DataLoaderX[Any]:
        return DataLoaderX(list(range(30)), batch_size=4, sampler=Stepping(30), num_workers=workers)

    whole, resumed = interrupted_and_resumed(make, 3)
    assert resumed == whole


@pytest.mark.parametrize("persistent", [False, True])
def test_the_workers_random_state_resumes(persistent: bool) -> None:
    def make() -> DataLoaderX[Any]:
        generator = torch.Generator().manual_seed(11)
        return DataLoaderX(Noisy(), batch_size=3, num_workers=2, persistent_workers=persistent, generator=generator)

    whole, resumed = interrupted_and_resumed(make, 3)
    assert resumed == whole  # the same random draws in every batch after the resume


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_at_position_zero_fixes_the_shuffle(workers: int) -> None:
    """shuffle=True with torch's global seed: the order is a draw no later run can repeat by itself."""
    loader = DataLoaderX(list(range(20)), batch_size=4, shuffle=True, num_workers=workers)
    iterator = iter(loader)
    state = json.loads(json.dumps(loader.state_dict()))  # after iter(), before the first batch
    expected = [batch.tolist() for batch in iterator]
    torch.manual_seed(12345)  # another global random state: the state decides
    resumed = DataLoaderX(list(range(20)), batch_size=4, shuffle=True, num_workers=workers)
    resumed.load_state_dict(state)
    assert run(resumed) == expected


def test_a_state_before_iterating_fixes_the_next_epochs_order() -> None:
    loader = DataLoaderX(list(range(20)), batch_size=4, shuffle=True)
    run(loader)
    state = loader.state_dict()  # after the end: names the next epoch, and fixes its seeds
    expected = run(loader)
    torch.manual_seed(999)
    resumed = DataLoaderX(list(range(20)), batch_size=4, shuffle=True)
    resumed.load_state_dict(state)
    assert state["epoch"] == 1 and run(resumed) == expected


def test_a_state_before_iter_is_given_back_unchanged() -> None:
    source = DataLoaderX(list(range(20)), batch_size=4, shuffle=True, num_workers=2)
    run(source, 2)
    state = source.state_dict()
    loader = DataLoaderX(list(range(20)), batch_size=4, shuffle=True, num_workers=2)
    loader.load_state_dict(state)
    assert loader.state_dict() == state


def test_a_random_sampler_without_a_generator_is_refused_with_what_to_do() -> None:
    loader = DataLoaderX(list(range(20)), batch_size=4, sampler=torch.utils.data.RandomSampler(range(20)))
    run(loader, 2)
    with pytest.raises(ValueError, match="shuffle=True on the loader, pass generator= to the sampler, or seed="):
        DataLoaderX(list(range(20)), batch_size=4, sampler=torch.utils.data.RandomSampler(range(20))).load_state_dict(
            loader.state_dict()
        )


def test_snapshot_every_n_steps_is_accepted_and_checked() -> None:
    loader = DataLoaderX(list(range(8)), batch_size=2, snapshot_every_n_steps=5)
    assert loader.snapshot_every_n_steps == 5 and len(run(loader)) == 4
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        DataLoaderX(list(range(8)), snapshot_every_n_steps=-1)


class Countdown(IterableDataset[int]):
    """Its own iterator: where it is lives on the object, so a shared object goes on from where it was."""

    def __init__(self, length: int = 10) -> None:
        self.length = length
        self.position = 0

    def __iter__(self) -> Countdown:
        return self

    def __next__(self) -> int:
        if self.position >= self.length:
            raise StopIteration
        self.position += 1
        return self.position - 1

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def test_a_dataset_that_is_its_own_iterator_resumes_from_a_state_at_position_zero() -> None:
    dataset = Countdown()
    loader = DataLoaderX(dataset, batch_size=2)
    iterator = iter(loader)
    state = loader.state_dict()
    expected = [batch.tolist() for batch in iterator]  # runs the shared object to its end
    resumed = DataLoaderX(dataset, batch_size=2)
    resumed.load_state_dict(state)
    assert run(resumed) == expected == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [0, 1])
def test_a_later_epoch_resumes_where_a_worker_has_not_delivered_yet(workers: int, k: int) -> None:
    """Persistent workers (and num_workers=0) go on into the next epoch with the dataset they ran out of data
    with: a state taken before a worker's first batch of that epoch resumes it from the epoch's start, not
    from the end it reached (it delivered nothing: its samples were lost)."""

    def make() -> DataLoaderX[int]:
        return DataLoaderX(Shards(6), batch_size=1, num_workers=workers, persistent_workers=workers > 0)

    uninterrupted = make()
    expected = [run(uninterrupted), run(uninterrupted)]
    loader = make()
    run(loader)  # epoch 0 to its end
    head = run(loader, k)  # k batches of epoch 1: the second worker has made none yet
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert head + run(resumed) == expected[1]
