"""accelerate's own ``accelerator.prepare`` of a DataLoaderX (it warns), and accelerate's resume recipe
``load_state`` + ``skip_first_batches``, with torch's DataLoader through accelerate as the control (one
process, CPU)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from fastloader import DataLoaderX
from tests.integrations.common import BATCH, LENGTH, Images, Items, reset_accelerate

pytest.importorskip("accelerate")
from accelerate import Accelerator, DataLoaderConfiguration  # noqa: E402

from fastloader.integrations.accelerate import prepare  # noqa: E402
from fastloader.integrations.accelerate_loader import ReadByTheLoader  # noqa: E402

NAMED = "fastloader.integrations.accelerate.prepare"
FULL = -(-LENGTH // BATCH)  # 13 batches
SAVED_AT = 5  # batches of epoch 1 before save_state


@pytest.fixture
def fresh() -> Iterator[Callable[[int], Accelerator]]:
    """A new Accelerator (CPU, accelerate's seedable sampler) after ``torch.manual_seed(seed)``, as after
    a restart; accelerate's shared state is reset in between and afterwards."""

    def make(seed: int) -> Accelerator:
        reset_accelerate()
        torch.manual_seed(seed)
        config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=3)
        return Accelerator(cpu=True, dataloader_config=config)

    yield make
    reset_accelerate()


def plain_prepare_warnings(accelerator: Accelerator, *objects: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepared = accelerator.prepare(*objects)
    return prepared, [str(w.message) for w in caught if NAMED in str(w.message)]


def test_plain_prepare_warns_once_per_loader(fresh: Callable[[int], Accelerator]) -> None:
    accelerator = fresh(0)
    first, second = DataLoaderX(Items(), batch_size=BATCH), DataLoaderX(Items(), batch_size=BATCH)
    model = torch.nn.Linear(1, 1)
    (_model, shard, _again), messages = plain_prepare_warnings(accelerator, model, first, first)
    assert type(shard).__name__ == "DataLoaderShard" and type(shard.base_dataloader) is DataLoader
    assert len(messages) == 1 and "no prefetch thread, no side-stream copy" in messages[0]
    assert plain_prepare_warnings(accelerator, first)[1] == []  # once per loader
    assert len(plain_prepare_warnings(accelerator, second)[1]) == 1
    assert plain_prepare_warnings(accelerator, DataLoader(Items(), batch_size=BATCH))[1] == []
    with warnings.catch_warnings(record=True) as caught:  # fastloader's prepare keeps it: nothing to warn
        warnings.simplefilter("always")
        kept = prepare(accelerator, DataLoaderX(Items(), batch_size=BATCH))
    assert type(kept.base_dataloader) is DataLoaderX and not [w for w in caught if NAMED in str(w.message)]


@pytest.mark.parametrize("workers", [0, 2])
def test_plain_prepare_on_the_cpu_keeps_normalize(fresh: Callable[[int], Accelerator], workers: int) -> None:
    """On the CPU, DataLoaderX normalizes in its collate_fn, which accelerate's rebuild keeps."""
    mean, std = (0.5, 0.25, 0.125), (0.25, 0.5, 2.0)
    loader = DataLoaderX(Images(), batch_size=BATCH, num_workers=workers, normalize=(mean, std), channels_last=True)
    shard, _messages = plain_prepare_warnings(fresh(0), loader)
    seen = []
    for images, indices in shard:
        assert images.dtype == torch.float32 and images.device.type == "cpu"
        assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
        for image, index in zip(images, indices.tolist(), strict=True):
            raw = torch.full((3, 2, 2), index, dtype=torch.float32) / 255
            expected = (raw - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
            torch.testing.assert_close(image, expected)
            seen.append(index)
    assert seen == list(range(LENGTH))


def epoch_and_ends(loader: Any, accelerator: Accelerator) -> tuple[list[list[int]], list[bool]]:
    batches, ends = [], []
    for _x, indices in loader:
        batches.append(indices.tolist())
        ends.append(accelerator.gradient_state.end_of_dataloader)
    return batches, ends


def uninterrupted_and_saved(
    make: Callable[[Accelerator], Any], fresh: Callable[[int], Accelerator], path: Path
) -> list[list[list[int]]]:
    """Three epochs, with save_state after SAVED_AT batches of epoch 1: the batches of each."""
    accelerator = fresh(0)
    loader = make(accelerator)
    epochs = []
    for number in range(3):
        batches = []
        for _x, indices in loader:
            batches.append(indices.tolist())
            if number == 1 and len(batches) == SAVED_AT:
                accelerator.save_state(str(path))
        epochs.append(batches)
    return epochs


def torch_loader(accelerator: Accelerator) -> Any:
    return accelerator.prepare(DataLoader(Items(), batch_size=BATCH, shuffle=True))


def plain_dataloaderx(accelerator: Accelerator) -> Any:
    shard, messages = plain_prepare_warnings(accelerator, DataLoaderX(Items(), batch_size=BATCH, shuffle=True))
    assert len(messages) == 1  # the user is told the DataLoaderX will not run
    return shard


@pytest.mark.parametrize("make", [torch_loader, plain_dataloaderx], ids=["torch", "plain_prepare"])
def test_skip_first_batches_recipe_on_accelerates_loader(
    fresh: Callable[[int], Accelerator], tmp_path: Path, make: Callable[[Accelerator], Any]
) -> None:
    """accelerate's recipe on accelerate's own loader (torch's DataLoader, or what a plain prepare makes of
    a DataLoaderX) restores no epoch: with set_epoch for the resumed epoch and the next, both are exact and
    the end is seen; the same samples for both loaders."""
    epochs = uninterrupted_and_saved(make, fresh, tmp_path / "checkpoint")
    assert epochs == uninterrupted_and_saved(torch_loader, fresh, tmp_path / "control")  # accelerate's order
    accelerator = fresh(1)
    loader = make(accelerator)
    accelerator.load_state(str(tmp_path / "checkpoint"))
    loader.set_epoch(1)  # skip_first_batches reads the epoch from the loader
    rest, ends = epoch_and_ends(accelerator.skip_first_batches(loader, SAVED_AT), accelerator)
    assert rest == epochs[1][SAVED_AT:] and ends == [False] * (FULL - SAVED_AT - 1) + [True]
    loader.set_epoch(2)
    assert epoch_and_ends(loader, accelerator) == (epochs[2], [False] * (FULL - 1) + [True])


def test_skip_first_batches_on_fastloaders_prepare_is_refused(
    fresh: Callable[[int], Accelerator], tmp_path: Path
) -> None:
    """accelerate's recipe on the loader fastloader's prepare returns: refused, naming the loader's own
    skip_first_batches; the loader then resumes exactly (load_state alone, or with the loader's
    skip_first_batches of the same count), sees the end, and goes on with the next epoch whole; another
    count on top of load_state would skip twice: refused."""

    def make(accelerator: Accelerator) -> Any:
        return prepare(accelerator, DataLoaderX(Items(), batch_size=BATCH, shuffle=True))

    epochs = uninterrupted_and_saved(make, fresh, tmp_path / "checkpoint")
    accelerator = fresh(1)
    loader = make(accelerator)
    accelerator.load_state(str(tmp_path / "checkpoint"))
    skipped = accelerator.skip_first_batches(loader, SAVED_AT)
    with pytest.raises(
        ValueError, match=r"skip_first_batches.*Call loader\.skip_first_batches\(n\) \(the loader's own method\)"
    ):
        next(iter(skipped))
    with pytest.raises(
        ValueError,
        match=rf"skip_first_batches\(2\) after load_state, which resumes this loader at batch {SAVED_AT} of epoch 1",
    ):
        loader.skip_first_batches(2)
    assert loader.skip_first_batches(SAVED_AT) is loader  # the recipe's count: load_state's position, kept
    rest, ends = epoch_and_ends(loader, accelerator)
    assert rest == epochs[1][SAVED_AT:] and ends == [False] * (FULL - SAVED_AT - 1) + [True]
    assert epoch_and_ends(loader, accelerator) == (epochs[2], [False] * (FULL - 1) + [True])


def test_the_batch_sampler_handed_out_reads_and_sets_but_does_not_iterate() -> None:
    """What PreparedLoader.batch_sampler (and .sampler, for DataLoader(sampler=BatchSampler(...))) hands out:
    still a BatchSampler with the inner one's attributes, as accelerate's get_sampler and
    join_uneven_inputs read and set them; iterating it is refused."""
    order = SequentialSampler(Items())
    inner = BatchSampler(order, BATCH, drop_last=False)
    handed = ReadByTheLoader(inner)
    assert isinstance(handed, BatchSampler) and handed.sampler is order and len(handed) == FULL
    handed.drop_last = True
    assert inner.drop_last is True and len(handed) == LENGTH // BATCH
    with pytest.raises(
        ValueError, match=r"skip_first_batches.*Call loader\.skip_first_batches\(n\) \(the loader's own method\)"
    ):
        iter(handed)
    # code that is not accelerate's skip_first_batches (a callback listing the order) is told what it did
    with pytest.raises(
        ValueError, match=r"^the batch sampler of a prepared loader \(loader\.batch_sampler\) was iterated"
    ):
        list(handed)
