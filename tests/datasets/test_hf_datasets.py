"""Hugging Face ``datasets`` objects used directly as DataLoaderX datasets (the real package): a map-style
``Dataset`` in torch format and an ``IterableDataset`` of shards deliver what torch's DataLoader delivers
over two epochs with two workers, and resume mid-epoch (torchdata's Stateful protocol, which
``datasets.IterableDataset`` implements) with the rest of the epoch the uninterrupted run's."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from fastloader import DataLoaderX
from tests.images import write_hf_by_path

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()
EPOCHS, WORKERS, BATCH = 2, 2, 4


@pytest.fixture()
def images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The by-path image set of ``tests.images``, read by ``datasets`` (from its directory: its paths are
    relative), images of one size, decoded by ``datasets`` in the workers."""
    write_hf_by_path(tmp_path / "set", count=18)
    monkeypatch.chdir(tmp_path / "set")
    return datasets.Dataset.from_parquet("train.parquet", cache_dir=str(tmp_path / "hf_cache"))


def batches(loader: Any, limit: int | None = None) -> list[tuple[torch.Tensor, list[int]]]:
    return [(batch["image"], batch["label"].tolist()) for batch in itertools.islice(iter(loader), limit)]


def same(got: list[tuple[torch.Tensor, list[int]]], expected: list[tuple[torch.Tensor, list[int]]]) -> bool:
    return len(got) == len(expected) and all(
        labels == want_labels and torch.equal(images, want)
        for (images, labels), (want, want_labels) in zip(got, expected)
    )


def test_a_map_style_dataset_in_torch_format_as_torch_delivers_it(images: Any) -> None:
    dataset = images.with_format("torch")

    def run(loader_class: type) -> list[Any]:
        generator = torch.Generator().manual_seed(7)
        loader = loader_class(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, generator=generator)
        return [batches(loader) for _ in range(EPOCHS)]

    expected, got = run(DataLoader), run(DataLoaderX)
    assert expected[0][0][0].shape == (BATCH, 3, 48, 64) and not same(expected[0], expected[1])  # reshuffled
    assert all(same(mine, theirs) for mine, theirs in zip(got, expected))


def test_an_iterable_dataset_of_shards_as_torch_delivers_it(images: Any) -> None:
    def run(loader_class: type) -> list[Any]:
        dataset = images.to_iterable_dataset(num_shards=4).shuffle(seed=3, buffer_size=6).with_format("torch")
        loader = loader_class(dataset, batch_size=BATCH, num_workers=WORKERS)
        epochs = []
        for epoch in range(EPOCHS):
            if loader_class is DataLoader:
                dataset.set_epoch(epoch)  # DataLoaderX does it itself, as it does torch samplers'
            epochs.append(batches(loader))
        return epochs

    expected, got = run(DataLoader), run(DataLoaderX)
    labels = sorted(label for _, batch in expected[0] for label in batch)
    assert labels == sorted(i % 3 for i in range(18)) and not same(expected[0], expected[1])  # all rows, reshuffled
    assert all(same(mine, theirs) for mine, theirs in zip(got, expected))


def resumed_after(make: Any, k: int) -> tuple[list[Any], list[Any]]:
    """The uninterrupted epoch, and ``k`` batches then the rest from a fresh loader given the state (through
    JSON, as a checkpoint keeps it)."""
    whole = batches(make())
    loader = make()
    head = batches(loader, k)
    state = json.loads(json.dumps(loader.state_dict()))
    fresh = make()
    fresh.load_state_dict(state)
    return whole, head + batches(fresh)


@pytest.mark.parametrize("k", [1, 3])
def test_a_map_style_dataset_resumes_mid_epoch(images: Any, k: int) -> None:
    dataset = images.with_format("torch")

    def make() -> DataLoaderX[Any]:
        generator = torch.Generator().manual_seed(5)
        return DataLoaderX(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, generator=generator)

    whole, resumed = resumed_after(make, k)
    assert same(resumed, whole)


@pytest.mark.parametrize("k", [1, 3])
def test_an_iterable_dataset_resumes_mid_epoch_from_its_own_state(images: Any, k: int) -> None:
    # datasets' IterableDataset is Stateful as torchdata's StatefulDataLoader expects: state_dict() without
    # arguments, per worker. (A shuffle buffer is not part of its state: datasets documents that such a resume
    # is not exact, so none here.)
    assert callable(images.to_iterable_dataset().state_dict)

    def make() -> DataLoaderX[Any]:
        dataset = images.to_iterable_dataset(num_shards=4).with_format("torch")
        return DataLoaderX(dataset, batch_size=BATCH, num_workers=WORKERS)

    whole, resumed = resumed_after(make, k)
    assert same(resumed, whole)
