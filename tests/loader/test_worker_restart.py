"""A worker killed by a signal under on_error="skip" / "replace": restarted, its batches sent again, a sample that
kills it twice quarantined (fastloader.loader.worker_restart).

The datasets kill their own worker process for real (SIGKILL, SIGSEGV) on one index: once (a flag file says it
happened) or every time. Each test checks the delivered batches sample by sample against torch's loader over the
same order.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastloader import DataLoaderX
from fastloader.datasets.base import ImageDataset
from fastloader.datasets.error_policy import ErrorPolicy
from fastloader.formats import bad_samples
from tests.loader.test_batch_ring import TRAIN, Photos, in_ring

N, BATCH, KILLER = 22, 4, 9  # the batch [8, 9, 10, 11] (sequential) holds the killer


class Killing(Dataset[int]):
    """Sample i is i; sample ``at`` kills its worker with ``sig``: once (``flag``: a file made right before the
    kill) or each time it is read (``flag`` None). An error policy of ``mode``, as fastloader's datasets keep."""

    def __init__(self, at: int, sig: int, flag: Path | None, quarantine: Path, mode: str = "skip") -> None:
        self.at, self.sig, self.flag = at, sig, flag
        self.error_policy = ErrorPolicy(mode, N, quarantine=quarantine)

    def __len__(self) -> int:
        return N

    def key(self, index: int) -> str:
        return f"sample-{index}.jpg"

    def __getitem__(self, index: int) -> int:
        if index == self.at and torch.utils.data.get_worker_info() is not None:
            if self.flag is None:
                os.kill(os.getpid(), self.sig)
            elif not self.flag.exists():
                self.flag.touch()
                os.kill(os.getpid(), self.sig)
        return index


def _loader(dataset: Dataset[int], workers: int, persistent: bool, shuffle: bool = False) -> DataLoaderX[int]:
    generator = torch.Generator().manual_seed(7) if shuffle else None
    return DataLoaderX(
        dataset,
        batch_size=BATCH,
        shuffle=shuffle,
        num_workers=workers,
        persistent_workers=persistent,
        generator=generator,
        stall_warning=None,
    )


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _torch_batches(shuffle: bool = False) -> list[list[int]]:
    """What torch's loader gives for the same order, with no worker dying."""
    generator = torch.Generator().manual_seed(7) if shuffle else None
    loader = DataLoader(list(range(N)), batch_size=BATCH, shuffle=shuffle, generator=generator)
    return [batch.tolist() for batch in loader]


def _epoch(loader: Any) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_killed_once_is_restarted_and_every_sample_comes_once(
    tmp_path: Path, workers: int, persistent: bool
) -> None:
    dataset = Killing(KILLER, signal.SIGKILL, tmp_path / "killed", tmp_path / "quarantine.tsv")
    loader = _loader(dataset, workers, persistent, shuffle=True)

    assert _epoch(loader) == _torch_batches(shuffle=True)
    assert (tmp_path / "killed").exists()  # the worker did die
    assert dataset.error_policy.bad_samples() == []  # one death quarantines nothing
    if persistent:  # the restarted worker serves the next epoch too
        assert sorted(sum(_epoch(loader), [])) == list(range(N))


@pytest.mark.parametrize(
    ("workers", "persistent", "sig"),
    [(1, False, signal.SIGKILL), (2, True, signal.SIGKILL), (2, False, signal.SIGSEGV), (1, True, signal.SIGSEGV)],
)
def test_a_sample_that_kills_twice_is_quarantined_and_its_batch_comes_without_it(
    tmp_path: Path, workers: int, persistent: bool, sig: int, caplog: pytest.LogCaptureFixture
) -> None:
    quarantine = tmp_path / "quarantine.tsv"
    dataset = Killing(KILLER, sig, None, quarantine)
    loader = _loader(dataset, workers, persistent)
    expected = [[i for i in batch if i != KILLER] for batch in _torch_batches()]

    with caplog.at_level(logging.WARNING, logger="fastloader"):
        assert _epoch(loader) == expected
    [found] = bad_samples.read(quarantine)
    assert (found.position, found.key) == (KILLER, f"sample-{KILLER}.jpg")
    assert found.reason.startswith(f"WorkerKilled: its worker died ({signal.Signals(sig).name})")
    assert any(f"sample-{KILLER}.jpg" in message for message in caplog.messages)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastloader"):  # the next epoch never sends it to a worker
        assert _epoch(loader) == expected
    assert not [message for message in caplog.messages if "died" in message]


def test_replace_keeps_the_batch_size_with_the_policys_substitute(tmp_path: Path) -> None:
    dataset = Killing(KILLER, signal.SIGKILL, None, tmp_path / "quarantine.tsv", mode="replace")
    expected = [[KILLER + 1 if i == KILLER else i for i in batch] for batch in _torch_batches()]

    assert _epoch(_loader(dataset, 2, False)) == expected
    assert [s.position for s in dataset.error_policy.bad_samples()] == [KILLER]


def test_under_raise_a_killed_worker_ends_the_run_as_in_torch(tmp_path: Path) -> None:
    dataset = Killing(KILLER, signal.SIGKILL, None, tmp_path / "quarantine.tsv", mode="raise")
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        _epoch(_loader(dataset, 2, False))


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_after_a_quarantine_gives_every_other_sample_once(tmp_path: Path, persistent: bool) -> None:
    quarantine = tmp_path / "quarantine.tsv"
    loader = _loader(Killing(KILLER, signal.SIGKILL, None, quarantine), 2, persistent, shuffle=True)
    expected = [[i for i in batch if i != KILLER] for batch in _torch_batches(shuffle=True)]
    at = next(n for n, batch in enumerate(_torch_batches(shuffle=True)) if KILLER in batch) + 1

    before: list[list[int]] = []
    for batch in loader:
        before.append(batch.tolist())
        if len(before) == at:  # right after the batch the killer was taken out of
            break
    state = loader.state_dict()

    # A new run: a new loader over the same dataset and quarantine, resumed where the first one stopped.
    resumed = _loader(Killing(KILLER, signal.SIGKILL, None, quarantine), 2, persistent, shuffle=True)
    resumed.load_state_dict(state)
    assert before + _epoch(resumed) == expected
    assert len(bad_samples.read(quarantine)) == 1


class KillingPhotos(ImageDataset[Any]):
    """Real JPEGs through the batch ring; the batch holding sample ``at`` kills its worker once, before decoding."""

    def __init__(self, at: int, flag: Path) -> None:
        super().__init__(Photos(40), transform=TRAIN)
        self.at, self.flag = at, flag

    def __getitems__(self, indices: Any) -> Any:
        if self.at in indices and torch.utils.data.get_worker_info() is not None and not self.flag.exists():
            self.flag.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitems__(indices)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_batch_made_again_writes_its_ring_slot_with_the_pixels_torch_would_give(tmp_path: Path, workers: int) -> None:
    """The restarted worker goes on with the dead one's random generators: the same random crops, pixel for pixel,
    as a run where no worker died, written into the batch ring."""
    killing = KillingPhotos(17, tmp_path / "killed")
    killing.set_error_policy("skip", quarantine=tmp_path / "quarantine.tsv")
    plain = ImageDataset(Photos(40), transform=TRAIN)
    loaders = [
        DataLoaderX(dataset, batch_size=4, shuffle=True, num_workers=workers, generator=_seeded(5))
        for dataset in (killing, plain)
    ]
    viewed = 0
    batches = 0
    for (images, labels), (plain_images, plain_labels) in zip(*loaders, strict=True):
        assert labels.tolist() == plain_labels.tolist()
        assert torch.equal(images, plain_images), f"batch {batches}: pixels differ"
        viewed += in_ring(loaders[0], images)
        batches += 1
    assert (tmp_path / "killed").exists() and batches == 10 and viewed > 0
    assert killing.error_policy is not None and killing.error_policy.bad_samples() == []


class LoggedKilling(Dataset[int]):
    """Sample i is i; each batch a worker makes is logged (its first sample, one line); the batch holding ``at``
    kills its worker once, right after writing the worker's pid into ``flag``."""

    def __init__(self, at: int, flag: Path, made: Path, quarantine: Path) -> None:
        self.at, self.flag, self.made = at, flag, made
        self.error_policy = ErrorPolicy("skip", 40, quarantine=quarantine)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        return index

    def __getitems__(self, indices: list[int]) -> list[int]:
        if self.at in indices and not self.flag.exists():
            self.flag.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        with self.made.open("a") as made:
            made.write(f"{indices[0]}\n")
        return list(indices)


def _wait_dead(flag: Path) -> None:
    """Until the worker that wrote its pid into ``flag`` is dead (a zombie: nothing has reaped it yet)."""
    while not flag.exists() or not flag.read_text():
        time.sleep(0.01)
    stat = Path(f"/proc/{flag.read_text()}/stat")
    while stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)


def test_a_batch_sent_while_its_worker_lies_dead_is_made_once(tmp_path: Path) -> None:
    """The training loop waits while the one worker sends batch 3 and dies making batch 4: the loader sees the
    death before it reads batch 3, so torch's request for batch 5 (on batch 3) waits for the new worker. That
    batch goes to it once: each batch is made once, the killer's too (its try left no line), every sample once.
    The batches are lists (no tensor): batch 3 can be read after its worker died, a tensor's memory could not."""
    made, flag = tmp_path / "made", tmp_path / "killed"
    dataset = LoggedKilling(16, flag, made, tmp_path / "quarantine.tsv")
    loader = DataLoaderX(
        dataset, batch_size=4, num_workers=1, prefetch_factor=2, max_prefetch=1, collate_fn=list, stall_warning=None
    )
    batches = iter(loader)
    out = [next(batches)]  # batch 0 here, 1 in DataLoaderX's queue, 2 waits for room, 3 and 4 sent
    _wait_dead(flag)
    out += list(batches)

    assert out == [list(range(i, i + 4)) for i in range(0, 40, 4)]
    counts = collections.Counter(int(line) // 4 for line in made.read_text().split())
    assert [counts[batch] for batch in range(10)] == [1] * 10, counts
    assert dataset.error_policy.bad_samples() == []


class ManyKillers(Dataset[int]):
    """64 samples, three of which kill their worker each time (two SIGKILL, one SIGSEGV)."""

    KILLERS = {20: signal.SIGKILL, 27: signal.SIGSEGV, 50: signal.SIGKILL}

    def __init__(self, quarantine: Path, mode: str) -> None:
        self.error_policy = ErrorPolicy(mode, 64, quarantine=quarantine)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index in self.KILLERS and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), self.KILLERS[index])
        return index


@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_three_killers_in_batches_of_16_are_each_found(tmp_path: Path, mode: str) -> None:
    """Workers die right after sending a batch, while its result may still be being written (the pipe's lock
    held): the hunt goes on to the end, every other sample once."""
    dataset = ManyKillers(tmp_path / "quarantine.tsv", mode)
    loader = DataLoaderX(dataset, batch_size=16, shuffle=True, generator=_seeded(1), num_workers=2, stall_warning=None)
    order = [b.tolist() for b in DataLoader(list(range(64)), batch_size=16, shuffle=True, generator=_seeded(1))]
    bad = ManyKillers.KILLERS
    if mode == "skip":
        expected = [[i for i in batch if i not in bad] for batch in order]
    else:
        expected = [[i + 1 if i in bad else i for i in batch] for batch in order]  # 21, 28, 51 are good

    assert _epoch(loader) == expected
    assert sorted(s.position for s in dataset.error_policy.bad_samples()) == sorted(bad)


class NumpyOrder(torch.utils.data.Sampler[Any]):
    """A user's sampler yielding numpy integers, as ``np.random.permutation`` gives them."""

    def __len__(self) -> int:
        return N

    def __iter__(self) -> Any:
        return iter(np.random.default_rng(3).permutation(N))


class BatchesOf(torch.utils.data.Sampler[Any]):
    """A user's batch sampler yielding each batch as ``kind`` makes it (a tuple, a numpy array, a tensor)."""

    def __init__(self, kind: Any) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return -(-N // BATCH)

    def __iter__(self) -> Any:
        for start in range(0, N, BATCH):
            yield self.kind(list(range(start, min(start + BATCH, N))))


class SeesBatches(Killing):
    """Killing, fetching whole batches (``__getitems__``) and noting the type of each batch of indices."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.types = torch.zeros(1, dtype=torch.int64).share_memory_()  # batches not of the sampler's type

    def __getitems__(self, indices: Any) -> list[int]:
        if not isinstance(indices, (tuple, np.ndarray, torch.Tensor)):
            self.types += 1
        return [self[int(i)] for i in indices]


def test_a_sampler_of_numpy_integers_quarantines_its_killer_and_the_epoch_ends(tmp_path: Path) -> None:
    dataset = Killing(KILLER, signal.SIGKILL, None, tmp_path / "quarantine.tsv")
    order = [int(i) for i in NumpyOrder()]
    expected = [[i for i in order[s : s + BATCH] if i != KILLER] for s in range(0, N, BATCH)]
    loader = DataLoaderX(dataset, batch_size=BATCH, sampler=NumpyOrder(), num_workers=2, stall_warning=None)
    assert _epoch(loader) == [b for b in expected if b]
    assert [s.position for s in dataset.error_policy.bad_samples()] == [KILLER]


@pytest.mark.parametrize("kind", [tuple, np.array, torch.tensor], ids=["tuple", "ndarray", "tensor"])
def test_a_batch_sampler_of_tuples_or_arrays_quarantines_its_killer(tmp_path: Path, kind: Any) -> None:
    dataset = SeesBatches(KILLER, signal.SIGKILL, None, tmp_path / "quarantine.tsv")
    loader = DataLoaderX(dataset, batch_sampler=BatchesOf(kind), num_workers=2, stall_warning=None)
    expected = [[i for i in batch if i != KILLER] for batch in _torch_batches()]
    assert _epoch(loader) == expected
    assert [s.position for s in dataset.error_policy.bad_samples()] == [KILLER]
    # the batches that held no killer reached the dataset as the batch sampler made them
    plain = DataLoaderX(SeesBatches(-1, signal.SIGKILL, None, tmp_path / "none.tsv"), batch_sampler=BatchesOf(kind))
    assert _epoch(plain) == _torch_batches()
