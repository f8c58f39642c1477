"""Every kind of batch torch's DataLoader passes through reaches the loop through DataLoaderX unchanged:
nested and sparse tensors, strings, None, namedtuples, custom objects (the stage clock counts what it can
and never fails a batch it cannot count)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastloader import DataLoaderX
from tests.toy_datasets import Pair


class Thing:
    """A custom object: no tensor, no sequence, no mapping."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Thing) and other.value == self.value

    def __hash__(self) -> int:
        return self.value


class Items(Dataset[Any]):
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        if self.kind == "nested":
            return torch.nested.nested_tensor([torch.full((i + 1,), float(i)), torch.ones(2)])
        if self.kind == "sparse":
            return torch.sparse_coo_tensor(torch.tensor([[0, i % 3]]), torch.tensor([float(i), 1.0]), (4,))
        if self.kind == "string":
            return f"sample-{i}"
        if self.kind == "none":
            return None
        if self.kind == "namedtuple":
            return Pair(torch.full((2,), float(i)), f"label-{i}")
        return Thing(i)


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


def plain(value: Any) -> Any:
    """Comparable form: tensors (nested, sparse) as nested lists."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return [plain(part) for part in value.unbind()]
        return value.to_dense().tolist() if value.is_sparse else value.tolist()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(plain(item) for item in value))
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


KINDS = {
    # kind: (batch_size, collate_fn) as a user would give them for such samples
    "nested": (2, as_list),
    "sparse": (None, None),
    "string": (2, None),
    "none": (None, None),
    "namedtuple": (2, None),
    "custom": (2, as_list),
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_batches_pass_through_as_with_torch(kind: str, workers: int) -> None:
    batch_size, collate_fn = KINDS[kind]
    options: dict[str, Any] = {"batch_size": batch_size, "collate_fn": collate_fn, "num_workers": workers}
    expected = [plain(batch) for batch in DataLoader(Items(kind), **options)]
    loader = DataLoaderX(Items(kind), **options)
    got = [plain(batch) for batch in loader]
    assert got == expected
    stats = loader.stats()
    assert stats["batches"] == len(expected)


def test_nested_tensor_batch_directly() -> None:
    """A nested tensor as the whole batch (batch_size=None): torch's nested tensors have no sizes."""
    loader = DataLoaderX(Items("nested"), batch_size=None, num_workers=2)
    got = [plain(batch) for batch in loader]
    assert got == [plain(batch) for batch in DataLoader(Items("nested"), batch_size=None, num_workers=2)]


def clone_collate(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    return [item.clone() for item in batch]


@pytest.mark.parametrize("context", sorted(torch.multiprocessing.get_all_start_methods()))
def test_nested_tensors_in_every_multiprocessing_context(context: str) -> None:
    """torch's own test_nested_tensor_multiprocessing, through DataLoaderX."""
    dataset = [torch.nested.nested_tensor([torch.randn(5)]) for _ in range(6)]
    loader = DataLoaderX(
        dataset, batch_size=1, num_workers=2, collate_fn=clone_collate, multiprocessing_context=context
    )
    for i, batch in enumerate(loader):
        assert torch.equal(batch[0].unbind()[0], dataset[i].unbind()[0])
    assert loader.stats()["batches"] == len(dataset)
