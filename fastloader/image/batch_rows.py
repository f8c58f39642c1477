"""Rows of a collated batch: drop some, or put another sample in one's place.

A batch decoded on the GPU is collated before its images are decoded, so a bad image found then
must leave (``skip``) or be replaced (``replace``) in every column at once: the image, the label and
any field. A collated batch is a list, tuple or dict of columns; a column with one entry per sample
is a tensor whose first dimension is the batch, or a list of the batch's length. Anything else (a
scalar, a column of another length) belongs to no row and is kept as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def columns(batch: Any) -> list[Any]:
    """The keys of ``batch``'s columns (dict keys, or positions of a list / tuple)."""
    if isinstance(batch, dict):
        return list(batch)
    if isinstance(batch, (list, tuple)):
        return list(range(len(batch)))
    raise TypeError(f"a collated batch is a list, tuple or dict of columns, got {type(batch).__name__}")


def rebuild(batch: Any, update: Callable[[Any, Any], Any]) -> Any:
    """``batch`` with each column replaced by ``update(key, column)``, keeping the container type."""
    if isinstance(batch, dict):
        return type(batch)({key: update(key, value) for key, value in batch.items()})
    values = [update(key, value) for key, value in enumerate(batch)]
    if isinstance(batch, tuple):
        return type(batch)(*values) if hasattr(batch, "_fields") else tuple(values)
    return values


def with_column(batch: Any, column: Any, value: Any) -> Any:
    """``batch`` with column ``column`` replaced by ``value``."""
    return rebuild(batch, lambda key, old: value if key == column else old)


def _is_row_column(value: Any, rows: int) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() > 0 and value.shape[0] == rows
    return isinstance(value, list) and len(value) == rows


def keep_rows(batch: Any, rows: int, keep: Sequence[int]) -> Any:
    """``batch`` (of ``rows`` samples) with only the rows ``keep``, in order."""
    index = torch.tensor(list(keep), dtype=torch.long)

    def take(_key: Any, value: Any) -> Any:
        if not _is_row_column(value, rows):
            return value
        if isinstance(value, torch.Tensor):
            return value.index_select(0, index.to(value.device))
        return [value[i] for i in keep]

    return rebuild(batch, take)


def put_row(batch: Any, rows: int, row: int, single: Any) -> Any:
    """``batch`` with row ``row`` taken from ``single``, a batch of one sample with the same columns."""

    def put(key: Any, value: Any) -> Any:
        if not _is_row_column(value, rows):
            return value
        other = single[key]
        if isinstance(value, torch.Tensor):
            value[row] = other[0].to(value.device)  # the batch is the loader's own: written in place
        else:
            value[row] = other[0]
        return value

    return rebuild(batch, put)
