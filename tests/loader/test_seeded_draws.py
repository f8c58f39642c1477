"""With ``seed=`` every random draw of a sample is a function of (seed, epoch, sample index): the same pixels
at any ``num_workers``, after a resume at another ``num_workers`` too (fastloader.sample_seeds)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import fastloader.transforms as T
from fastloader import DataLoaderX
from fastloader.datasets import ImageFolder
from fastloader.sample import make_sample_folder

SEED = 17
MEAN_STD = ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample_folder(tmp_path_factory.mktemp("seeded") / "images", 12, num_classes=3)


def train_folder(root: Path) -> ImageFolder:
    """The train pipeline: RandomResizedCrop + RandomHorizontalFlip, fused with the decode."""
    return ImageFolder(root, transform=T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()]))


def run(dataset: Any, workers: int, epochs: int = 2, **extras: Any) -> list[list[Any]]:
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, num_workers=workers, seed=SEED, **extras)
    return [[_plain(batch) for batch in loader] for _ in range(epochs)]


def _plain(batch: Any) -> Any:
    images, labels = batch
    return images.clone(), labels.clone()


def _equal(ours: list[list[Any]], theirs: list[list[Any]]) -> bool:
    return all(
        len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
        for a, b in zip(ours, theirs, strict=True)
    )


@pytest.mark.timeout(240)
def test_the_train_pipeline_gives_the_same_pixels_at_any_num_workers(folder: Path) -> None:
    torch.manual_seed(0)
    alone = run(train_folder(folder), 0)
    torch.manual_seed(1)  # the global seed no longer decides the crops: seed= does
    assert _equal(run(train_folder(folder), 1), alone)
    torch.manual_seed(2)
    assert _equal(run(train_folder(folder), 3), alone)
    assert not torch.equal(alone[0][0][0], alone[1][0][0]), "another epoch draws other crops"


@pytest.mark.timeout(240)
def test_random_flip_is_drawn_per_sample(folder: Path) -> None:
    extras = {"normalize": MEAN_STD, "random_flip": 0.5}
    alone = run(train_folder(folder), 0, **extras)
    assert _equal(run(train_folder(folder), 2, **extras), alone)
    unflipped = run(train_folder(folder), 0, normalize=MEAN_STD)
    flipped = [not torch.equal(a[0][i], b[0][i]) for a, b in zip(alone[0], unflipped[0]) for i in range(a[0].shape[0])]
    assert any(flipped) and not all(flipped), "about half of the samples flip"


class GlobalDraws(Dataset[tuple[int, float]]):
    """A user's dataset whose transform draws from the three global generators."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[int, float]:
        draws = random.random() + float(np.random.random_sample()) + float(torch.rand(1))
        return index, draws


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [1, 3])
def test_a_datasets_global_draws_are_the_same_at_any_num_workers(workers: int) -> None:
    def values(workers: int) -> dict[int, float]:
        loader = DataLoaderX(GlobalDraws(), batch_size=3, shuffle=True, num_workers=workers, seed=SEED)
        return {int(i): float(v) for indices, draws in loader for i, v in zip(indices, draws)}

    torch.manual_seed(5)
    alone = values(0)
    torch.manual_seed(6)
    assert values(workers) == alone
    assert len(set(alone.values())) == len(alone), "each sample draws its own numbers"


class NoDraws(GlobalDraws):
    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, 0.0


def test_num_workers_0_puts_the_training_loops_generators_back() -> None:
    def after_an_epoch(dataset: Dataset[Any]) -> tuple[float, float, float]:
        torch.manual_seed(3)
        random.seed(3)
        np.random.seed(3)
        for _ in DataLoaderX(dataset, batch_size=3, seed=SEED):
            pass
        return float(torch.rand(1)), random.random(), float(np.random.random_sample())

    # The loop's generators move only by the iterator's own draw (torch's base seed), as without draws.
    assert after_an_epoch(GlobalDraws()) == after_an_epoch(NoDraws())


@pytest.mark.timeout(300)
def test_a_resume_at_another_num_workers_gives_the_same_pixels(folder: Path) -> None:
    extras = {"normalize": MEAN_STD, "random_flip": 0.5}
    uninterrupted = run(train_folder(folder), 2, **extras)
    loader = DataLoaderX(train_folder(folder), batch_size=4, shuffle=True, num_workers=2, seed=SEED, **extras)
    for _ in loader:
        pass  # epoch 0
    seen = []
    for batch in loader:
        seen.append(_plain(batch))
        break
    state = loader.state_dict()
    del loader
    torch.manual_seed(99)
    resumed = DataLoaderX(train_folder(folder), batch_size=4, shuffle=True, num_workers=3, seed=SEED, **extras)
    resumed.load_state_dict(state)
    rest = [_plain(batch) for batch in resumed]
    assert _equal([seen + rest], [uninterrupted[1]])


@pytest.mark.timeout(240)
def test_thread_workers_draw_the_crops_process_workers_draw(folder: Path) -> None:
    # Without seed=: a worker's draws come from its seeds (torch's base_seed + id), in a process from the
    # global generator, in a thread from the thread's own (thread_safe_generator), never from a shared one.
    def epochs(method: str) -> list[list[Any]]:
        torch.manual_seed(5)
        loader = DataLoaderX(train_folder(folder), batch_size=3, shuffle=True, num_workers=2, worker_method=method)
        return [[_plain(batch) for batch in loader] for _ in range(2)]

    assert _equal(epochs("thread"), epochs("process"))
