"""litdata's StreamingDataset in DataLoaderX, litdata's own StreamingDataLoader as the control in each test:
the same samples each epoch (each once), and a mid-epoch state_dict() / load_state_dict() that resumes as
litdata's loader resumes (litdata's resume protocol, ``fastloader.loader.dataset_protocols``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

litdata = pytest.importorskip("litdata")
from litdata import StreamingDataLoader, StreamingDataset  # noqa: E402
from litdata.streaming.writer import BinaryWriter  # noqa: E402

from fastloader import DataLoaderX  # noqa: E402

SAMPLES = 50
BATCH = 4
INTO_EPOCH = 5  # batches received before the state is taken


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> str:
    """50 samples in chunks of 7, written as litdata's optimize writes them."""
    folder = tmp_path_factory.mktemp("litdata")
    writer = BinaryWriter(str(folder), chunk_size=7)
    for index in range(SAMPLES):
        writer[index] = {"index": index, "pixels": torch.full((3, 4, 4), index % 251, dtype=torch.uint8)}
    writer.done()
    writer.merge()
    return str(folder)


def _loader(kind: Any, chunks: str, workers: int) -> Any:
    dataset = StreamingDataset(chunks, shuffle=True, seed=7)
    return kind(dataset, batch_size=BATCH, num_workers=workers)


def _keys(batches: Any) -> list[int]:
    keys = []
    for batch in batches:
        assert torch.equal(batch["pixels"][:, 0, 0, 0], (batch["index"] % 251).to(torch.uint8))
        keys.extend(batch["index"].tolist())
    return keys


@pytest.mark.parametrize("workers", [0, 2])
def test_each_sample_once_per_epoch_as_in_litdatas_loader(chunks: str, workers: int) -> None:
    expected_loader = _loader(StreamingDataLoader, chunks, workers)
    expected = [_keys(expected_loader) for _ in range(2)]
    loader = _loader(DataLoaderX, chunks, workers)
    got = [_keys(loader) for _ in range(2)]
    assert got == expected
    assert all(sorted(epoch) == list(range(SAMPLES)) for epoch in got)
    assert got[0] != got[1]  # litdata's shuffle of each epoch, which DataLoaderX tells it as its loader does


def _interrupted(kind: Any, chunks: str, workers: int) -> tuple[list[int], Any, list[int]]:
    loader = _loader(kind, chunks, workers)
    iterator = iter(loader)
    seen = _keys(next(iterator) for _ in range(INTO_EPOCH))
    state = json.loads(json.dumps(loader.state_dict()))  # what a checkpoint keeps
    rest = _keys(iterator)
    return seen, state, rest


def _resumed(kind: Any, chunks: str, workers: int, state: Any) -> list[list[int]]:
    loader = _loader(kind, chunks, workers)
    loader.load_state_dict(state)
    return [_keys(loader), _keys(loader)]  # the rest of the epoch, then the next one


@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_as_in_litdatas_loader(chunks: str, workers: int) -> None:
    seen, state, rest = _interrupted(DataLoaderX, chunks, workers)
    resumed = _resumed(DataLoaderX, chunks, workers, state)
    assert resumed[0] == rest  # the rest of the interrupted epoch, in its order
    assert sorted(seen + resumed[0]) == list(range(SAMPLES))
    assert sorted(resumed[1]) == list(range(SAMPLES))
    assert state["dataset"]["num_samples_yielded"] == INTO_EPOCH * BATCH
    # litdata's own loader, interrupted and resumed at the same batch: the same samples in the same order
    own_seen, own_state, own_rest = _interrupted(StreamingDataLoader, chunks, workers)
    assert own_seen == seen and own_rest == rest
    assert _resumed(StreamingDataLoader, chunks, workers, own_state) == resumed


def test_state_at_an_epoch_boundary_starts_the_next_epoch_afresh(chunks: str) -> None:
    loader = _loader(DataLoaderX, chunks, 2)
    first = _keys(loader)
    state = loader.state_dict()
    assert state["dataset"] is None
    resumed = _loader(DataLoaderX, chunks, 2)
    resumed.load_state_dict(state)
    second = _keys(resumed)
    uninterrupted = _loader(DataLoaderX, chunks, 2)
    assert [_keys(uninterrupted), _keys(uninterrupted)] == [first, second]
