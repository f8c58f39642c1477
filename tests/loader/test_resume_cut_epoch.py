"""A state taken where the training loop cut an epoch short (it stops asking for batches, as Lightning's
``limit_train_batches`` does), loaded, and the loop going on with the next epoch: the next epochs are the
uninterrupted run's, not the rest of the cut one. The loop moves on by ``loader.set_epoch`` before
``iter()``, or by setting the sampler's epoch after ``iter()`` (Lightning's order when it restores a
checkpoint)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler

from fastloader import DataLoaderX
from tests.loader.test_resume import Indices

LENGTH, BATCH, CUT = 104, 4, 8  # 26 batches an epoch, the loop takes 8: prefetching never reaches the end
EPOCHS = 3


def make(order: str, workers: str) -> DataLoaderX[Any]:
    """``workers``: "0", "2", or "2p" (2 persistent workers)."""
    dataset = Indices(LENGTH)
    extra: dict[str, Any] = {"num_workers": int(workers[0]), "persistent_workers": workers.endswith("p")}
    if order == "distributed":  # torch's DistributedSampler (Lightning's), its order a function of the epoch
        extra["sampler"] = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=5)
    elif order == "seed":
        extra["seed"] = 7
    else:
        extra["shuffle"] = True
    if order == "generator":
        extra["generator"] = torch.Generator().manual_seed(3)
    return DataLoaderX(dataset, batch_size=BATCH, **extra)


def tell_sampler(loader: DataLoaderX[Any], epoch: int) -> None:
    """What Lightning does at each epoch's start: the sampler's set_epoch, where it has one."""
    set_epoch = getattr(loader.sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


def cut_epoch(loader: DataLoaderX[Any], epoch: int, moves: str) -> list[list[int]]:
    """The loop's first CUT batches of ``epoch``, told as ``moves`` says; the iterator is then dropped."""
    if moves == "set_epoch":
        loader.set_epoch(epoch)
    iterator = iter(loader)
    if moves == "sampler":
        tell_sampler(loader, epoch)
    batches = [batch.tolist() for batch in itertools.islice(iterator, CUT)]
    del iterator
    return batches


@pytest.mark.parametrize("moves", ["set_epoch", "sampler"])
@pytest.mark.parametrize("workers", ["0", "2", "2p"])
@pytest.mark.parametrize("order", ["global", "generator", "distributed", "seed"])
def test_a_state_at_the_last_batch_of_a_cut_epoch_resumes_into_the_next_epoch(
    order: str, workers: str, moves: str
) -> None:
    torch.manual_seed(0)  # the script's start: the same in the interrupted and the resumed process
    loader = make(order, workers)
    uninterrupted, state = [], None
    for epoch in range(EPOCHS):
        uninterrupted.append(cut_epoch(loader, epoch, moves))
        if epoch == 0:
            state = json.loads(json.dumps(loader.state_dict()))  # after the cut epoch's last batch
    del loader
    assert state is not None and state["epoch"] == 0 and state["batches_yielded"] == CUT

    torch.manual_seed(0)
    resumed = make(order, workers)
    resumed.load_state_dict(state)
    after = [cut_epoch(resumed, epoch, moves) for epoch in range(1, EPOCHS)]

    assert after == uninterrupted[1:]  # the same samples, in the same order, epoch by epoch
    assert resumed.state_dict()["epoch"] == EPOCHS - 1


@pytest.mark.parametrize("workers", ["0", "2"])
def test_without_a_new_epoch_the_loaded_state_goes_on_with_the_cut_epoch(workers: str) -> None:
    """Nothing moved on (the sampler told the loaded epoch itself, as Lightning does mid-epoch): the rest of it."""
    torch.manual_seed(0)
    loader = make("generator", workers)
    whole = [batch.tolist() for batch in loader]
    torch.manual_seed(0)
    loader = make("generator", workers)
    assert cut_epoch(loader, 0, "sampler") == whole[:CUT]
    state = loader.state_dict()
    resumed = make("generator", workers)
    resumed.load_state_dict(state)
    iterator = iter(resumed)
    tell_sampler(resumed, 0)
    assert [batch.tolist() for batch in iterator] == whole[CUT:]
