"""After a resume, the epochs that follow the loaded one are the uninterrupted run's, with ``shuffle=True``
and torch's global RNG deciding the order (each epoch draws its seed from it): the state carries where the
uninterrupted run's draws would go on (``next_rng``), whatever the resumed process's global RNG is."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from fastloader import DataLoaderX

SAMPLES, BATCH, EPOCHS = 12, 3, 4


def _loader(workers: int, persistent: bool) -> DataLoaderX[Any]:
    return DataLoaderX(
        list(range(SAMPLES)),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
    )


def _epoch(loader: DataLoaderX[Any], set_epoch: int | None = None) -> list[int]:
    if set_epoch is not None:
        loader.set_epoch(set_epoch)
    return [int(x) for batch in loader for x in batch]


def _uninterrupted(workers: int, persistent: bool) -> list[list[int]]:
    torch.manual_seed(0)
    loader = _loader(workers, persistent)
    return [_epoch(loader) for _ in range(EPOCHS)]


def _state_at(epoch: int, batches: int, workers: int, persistent: bool, set_epoch: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    loader = _loader(workers, persistent)
    for number in range(epoch):
        _epoch(loader, number if set_epoch else None)
    if set_epoch:
        loader.set_epoch(epoch)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    del iterator
    return state


@pytest.mark.parametrize("set_epoch", [False, True])
@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize(("epoch", "batches"), [(0, 2), (1, 2), (2, 0), (1, 4)])
def test_epochs_after_a_resume_are_the_uninterrupted_runs(
    epoch: int, batches: int, workers: int, persistent: bool, set_epoch: bool
) -> None:
    expected = _uninterrupted(workers, persistent)
    state = _state_at(epoch, batches, workers, persistent, set_epoch)
    torch.manual_seed(0)  # a new process that seeds as the interrupted one did (the defect replayed epoch 0)
    resumed = _loader(workers, persistent)
    resumed.load_state_dict(state)
    got = [_epoch(resumed, number if set_epoch else None) for number in range(epoch, EPOCHS)]
    assert got[0] == expected[epoch][batches * BATCH :]
    assert got[1:] == expected[epoch + 1 :]


def test_a_resumed_run_resumed_again_stays_on_the_uninterrupted_run() -> None:
    expected = _uninterrupted(0, False)
    state = _state_at(1, 1, 0, False, False)
    torch.manual_seed(99)
    first = _loader(0, False)
    first.load_state_dict(state)
    _epoch(first)  # the rest of epoch 1
    iterator = iter(first)  # epoch 2, interrupted again after 2 batches
    seen = [int(x) for _ in range(2) for x in next(iterator)]
    again = json.loads(json.dumps(first.state_dict()))
    del iterator
    torch.manual_seed(7)
    second = _loader(0, False)
    second.load_state_dict(again)
    assert seen + _epoch(second) == expected[2]
    assert _epoch(second) == expected[3]
