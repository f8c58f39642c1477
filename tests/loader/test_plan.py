"""DataLoaderX's plan is made once: an epoch writes nothing into the loader, and what the plan is made of
cannot be changed after ``__init__``."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from fastloader import DataLoaderX


class Images(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 4, 4), index, dtype=torch.uint8), index


def _attributes(loader: DataLoaderX[Any]) -> dict[str, Any]:
    return dict(vars(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_writes_nothing_into_the_loader(workers: int, caplog: pytest.LogCaptureFixture) -> None:
    loader = DataLoaderX(
        Images(),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        normalize=([0.5] * 3, [0.25] * 3),
        random_flip=0.5,
        report_every=1,
        stall_warning=60.0,
    )
    before = _attributes(loader)
    with caplog.at_level(logging.INFO, logger="fastloader"):
        for _ in range(2):
            assert len(list(loader)) == 3
        iterator = iter(loader)
        next(iterator)
        loader.load_state_dict(loader.state_dict())
    after = _attributes(loader)
    assert after.keys() == before.keys()
    assert [name for name in before if after[name] is not before[name]] == []
    assert loader.stats()["batches"] == 7 and len(caplog.records) == 7  # the epochs ran, with their reports


def test_with_persistent_workers_only_torchs_own_iterator_is_kept_on_the_loader() -> None:
    loader = DataLoaderX(Images(), batch_size=4, num_workers=2, persistent_workers=True)
    before = _attributes(loader)
    assert len(list(loader)) == 3 and len(list(loader)) == 3
    after = _attributes(loader)
    assert [name for name in before if after[name] is not before[name]] == ["_iterator"]


def test_auto_is_measured_once_into_num_workers_and_prefetch_factor() -> None:
    loader = DataLoaderX(Images(), batch_size=4, num_workers="auto", prefetch_factor="auto")
    before = _attributes(loader)
    assert len(list(loader)) == 3
    after = _attributes(loader)
    assert [name for name in before if after[name] is not before[name]] == ["num_workers", "prefetch_factor"]
    assert type(loader.num_workers) is int and loader.stats()["autotune"]["num_workers"] == loader.num_workers
    assert len(list(loader)) == 3 and _attributes(loader) == after  # measured once


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_prefetch", 4), ("report_every", 10), ("stall_warning", None), ("device", "cpu"), ("normalize", None)],
)
def test_what_the_plan_is_made_of_cannot_be_set_after_init(name: str, value: Any) -> None:
    loader = DataLoaderX(Images(), batch_size=4)
    with pytest.raises(ValueError, match=f"^{name} attribute should not be set after DataLoaderX is initialized"):
        setattr(loader, name, value)
    loader.pin_memory = False  # torch's own arguments stay as torch has them
    assert [labels.tolist() for _, labels in loader][0] == [0, 1, 2, 3]
