"""Resume into the same loader or a fresh one, with and without (persistent) workers, in order or not: the
batches after the resume are those of the uninterrupted run (the same sequence in order; with
``in_order=False`` exactly the batches not yet received, each once)."""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from fastloader import DataLoaderX


class SlowFirst(Dataset[int]):
    """Item i is i; item ``slow`` takes a while, so that with in_order=False later batches overtake it."""

    def __init__(self, length: int = 20, slow: int = 0, seconds: float = 0.5) -> None:
        self.length, self.slow, self.seconds = length, slow, seconds

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index == self.slow:
            time.sleep(self.seconds)
        return index


def make(workers: int, persistent: bool, in_order: bool, slow: int = -1) -> DataLoaderX[Any]:
    return DataLoaderX(
        SlowFirst(slow=slow),
        batch_size=2,
        shuffle=True,
        generator=torch.Generator().manual_seed(5),
        num_workers=workers,
        persistent_workers=persistent,
        in_order=in_order,
    )


def epoch(loader: DataLoaderX[Any], limit: int | None = None) -> list[tuple[int, ...]]:
    return [tuple(batch.tolist()) for batch in itertools.islice(iter(loader), limit)]


def same(got: list[tuple[int, ...]], expected: list[tuple[int, ...]], in_order: bool) -> bool:
    return got == expected if in_order else Counter(got) == Counter(expected)


CASES = [
    (workers, persistent, in_order, where)
    for workers in (0, 2)
    for persistent in ((False, True) if workers else (False,))
    for in_order in (True, False)
    for where in ("same", "fresh")
]


@pytest.mark.parametrize(("workers", "persistent", "in_order", "where"), CASES)
def test_resume_gives_the_uninterrupted_run(workers: int, persistent: bool, in_order: bool, where: str) -> None:
    reference = make(workers, persistent, True)  # persistent workers draw no new worker seed each epoch
    expected = [epoch(reference), epoch(reference)]

    slow = expected[0][0][0]  # the first batch's first sample is slow: with in_order=False it comes late
    loader = make(workers, persistent, in_order, slow=slow)
    head = epoch(loader, 3)
    state = json.loads(json.dumps(loader.state_dict()))
    if not in_order and workers:
        assert slow not in sum(head, ()), "the slow sample should have been overtaken"
    resumed = loader if where == "same" else make(workers, persistent, in_order, slow=slow)
    resumed.load_state_dict(state)
    rest = epoch(resumed)
    assert same(head + rest, expected[0], in_order)
    assert same(epoch(resumed), expected[1], in_order)  # and the next epoch as uninterrupted


def test_persistent_workers_same_loader_gives_the_remaining_batches() -> None:
    """The reported case: the persistent iterator kept its index sampler, so the state was ignored."""
    loader = DataLoaderX(list(range(20)), batch_size=2, num_workers=2, persistent_workers=True)
    head = epoch(loader, 3)
    loader.load_state_dict(loader.state_dict())
    rest = epoch(loader)
    assert head == [(0, 1), (2, 3), (4, 5)]
    assert rest == [(i, i + 1) for i in range(6, 20, 2)]  # 7 batches, not the 10 of a restarted epoch


def test_out_of_order_resume_loses_and_repeats_nothing() -> None:
    """The reported case: in_order=False with a slow sample 0; the resume must give exactly the rest."""
    loader = DataLoaderX(SlowFirst(10, slow=0, seconds=1.0), num_workers=2, in_order=False)
    head = [int(batch) for batch in itertools.islice(iter(loader), 4)]
    assert 0 not in head
    state = loader.state_dict()
    assert state["after"] != [] or state["batches_yielded"] < 4  # received out of order: not a prefix
    resumed = DataLoaderX(SlowFirst(10, slow=0, seconds=1.0), num_workers=2, in_order=False)
    resumed.load_state_dict(state)
    rest = [int(batch) for batch in resumed]
    assert sorted(head + rest) == list(range(10))
