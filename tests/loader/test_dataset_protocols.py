"""Which resume protocol a dataset speaks (fastloader.loader.dataset_protocols): torchdata's state_dict()
only when it takes no argument; any other state_dict is never called, the dataset iterated as torch's
loader iterates it, and a mid-epoch resume that would need it refused with the reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from fastloader import DataLoaderX
from fastloader.loader.dataset_protocols import foreign_state, stateful


class TwoArgumentState:
    """A state_dict of another protocol (litdata's and MosaicML's take arguments): never torchdata's."""

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        raise AssertionError("DataLoaderX called a state_dict that takes arguments")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise AssertionError("DataLoaderX called load_state_dict of a foreign protocol")


class MapWithForeignState(TwoArgumentState, Dataset[int]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        return index


class StreamWithForeignState(TwoArgumentState, IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(worker, 12, workers))


class OptionalArguments:
    """torchdata's protocol with optional arguments (a torch-style destination / prefix): callable bare."""

    def state_dict(self, destination: Any = None, *args: Any, **kwargs: Any) -> dict[str, int]:
        return {"at": 0}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


def test_only_a_state_dict_callable_without_arguments_is_torchdatas() -> None:
    assert stateful(OptionalArguments())
    assert not stateful(TwoArgumentState())
    assert not stateful(torch.nn.Linear(1, 1))  # weights, not a position
    assert foreign_state(TwoArgumentState()) == "state_dict(num_samples, from_beginning)"
    assert foreign_state(OptionalArguments()) is None


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [MapWithForeignState, StreamWithForeignState])
def test_a_foreign_state_dict_is_iterated_as_torch_iterates_it(kind: type, workers: int) -> None:
    expected = [batch.tolist() for batch in DataLoader(kind(), batch_size=3, num_workers=workers)]
    loader = DataLoaderX(kind(), batch_size=3, num_workers=workers)
    iterator = iter(loader)
    got = [next(iterator).tolist()]
    loader.state_dict()  # a checkpoint on the way: the dataset's state_dict is not asked for
    got += [batch.tolist() for batch in iterator]
    assert got == expected


def test_mid_epoch_resume_of_a_map_style_dataset_with_a_foreign_state_is_exact() -> None:
    loader = DataLoaderX(MapWithForeignState(), batch_size=3, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [batch.tolist() for batch in iterator]
    resumed = DataLoaderX(MapWithForeignState(), batch_size=3, num_workers=2)
    resumed.load_state_dict(state)  # its order is the sampler's: the dataset's own state is not needed
    assert [batch.tolist() for batch in resumed] == rest


def test_mid_epoch_resume_of_a_stream_with_a_foreign_state_is_refused_with_the_reason() -> None:
    loader = DataLoaderX(StreamWithForeignState(), batch_size=3, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    resumed = DataLoaderX(StreamWithForeignState(), batch_size=3, num_workers=2)
    with pytest.raises(ValueError, match=r"StreamWithForeignState has state_dict\(num_samples.*not torchdata's"):
        resumed.load_state_dict(state)
    del iterator


def test_a_library_state_does_not_load_into_another_dataset() -> None:
    loader = DataLoaderX(MapWithForeignState(), batch_size=3)
    state = loader.state_dict()
    state["dataset"] = {"num_samples_yielded": 3}
    with pytest.raises(ValueError, match="library's resume protocol.*MapWithForeignState"):
        DataLoaderX(MapWithForeignState(), batch_size=3).load_state_dict(state)
