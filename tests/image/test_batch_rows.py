"""Rows of collated batches: what GPU decode's error policy does to a batch with a bad image."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from fastloader.image.batch_rows import columns, keep_rows, put_row, with_column


def dict_batch() -> dict[str, object]:
    return {
        "image": torch.arange(4 * 2).view(4, 2),
        "label": torch.tensor([10, 11, 12, 13]),
        "txt": ["a", "b", "c", "d"],
        "target": [{"boxes": torch.zeros(i, 4)} for i in range(4)],
        "epoch": 7,  # belongs to no row
        "shared": torch.ones(3),  # another length: belongs to no row
    }


def test_keep_rows_takes_the_same_rows_from_every_column() -> None:
    kept = keep_rows(dict_batch(), 4, [0, 2, 3])
    assert kept["image"].tolist() == [[0, 1], [4, 5], [6, 7]] and kept["label"].tolist() == [10, 12, 13]
    assert kept["txt"] == ["a", "c", "d"] and [len(t["boxes"]) for t in kept["target"]] == [0, 2, 3]
    assert kept["epoch"] == 7 and kept["shared"].shape == (3,)


def test_put_row_replaces_one_sample_in_every_column() -> None:
    single = {
        "image": torch.tensor([[90, 91]]),
        "label": torch.tensor([99]),
        "txt": ["z"],
        "target": [{"boxes": torch.ones(5, 4)}],
        "epoch": 7,
        "shared": torch.ones(3),
    }
    batch = put_row(dict_batch(), 4, 1, single)
    assert batch["image"][1].tolist() == [90, 91] and batch["image"][0].tolist() == [0, 1]
    assert batch["label"].tolist() == [10, 99, 12, 13] and batch["txt"] == ["a", "z", "c", "d"]
    assert len(batch["target"][1]["boxes"]) == 5 and batch["epoch"] == 7


def test_list_tuple_and_namedtuple_batches_keep_their_type() -> None:
    Batch = namedtuple("Batch", ["images", "labels"])
    for batch in ([torch.zeros(3, 2), torch.tensor([1, 2, 3])], (torch.zeros(3, 2), torch.tensor([1, 2, 3]))):
        assert type(keep_rows(batch, 3, [1])) is type(batch)
    named = keep_rows(Batch(torch.zeros(3, 2), torch.tensor([1, 2, 3])), 3, [2, 0])
    assert isinstance(named, Batch) and named.labels.tolist() == [3, 1]
    assert columns(named) == [0, 1] and with_column(named, 0, "x").images == "x"


def test_a_batch_that_is_not_a_container_of_columns_is_refused() -> None:
    with pytest.raises(TypeError, match="columns"):
        columns(torch.zeros(2))
