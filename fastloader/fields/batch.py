"""A batch of samples with fields, collated in the worker: :class:`FieldBatch`.

A dataset given ``fields=`` returns one from ``__getitems__``: its columns are collated in the worker,
each by what it holds. Images and masks of one size are stacked (images from the batch buffer,
``fastloader.image.batching``); ints become int64 tensors, floats float64 tensors, arrays of one shape
a stacked tensor; text, JSON, bytes, boxes (a different count per image) and anything of varying
size stay lists. ``fastloader.image.batching.collate`` gives ``[column, ...]`` for tuple samples and
``{name: column}`` for dict samples (:meth:`FieldBatch.collated`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from fastloader.fields.specs import Layout, Output
from fastloader.image.batching import collate_labels


def _row(column: Any, index: int) -> Any:
    """Sample ``index``'s part of a collated column."""
    if isinstance(column, (torch.Tensor, list, tuple)):
        return column[index]
    if isinstance(column, dict):
        return {name: _row(value, index) for name, value in column.items()}
    return column


def _same_shape(values: Sequence[Any]) -> bool:
    return len({(tuple(value.shape), value.dtype) for value in values}) == 1


def collate_column(output: Output, values: Sequence[Any]) -> Any:
    """One column of a :class:`FieldBatch` (see the module docstring)."""
    if output.role == "label":
        return collate_labels(values)
    if output.role in ("image", "mask") or (output.role == "field" and output.kind == "array"):
        if all(isinstance(value, (torch.Tensor, np.ndarray)) for value in values) and _same_shape(values):
            return default_collate(list(values))  # stacked; in a worker, in shared memory
        return list(values)
    if output.role == "field" and output.kind in ("int", "float"):
        return default_collate(list(values))  # int64 / float64
    return list(values)


class FieldBatch(list[Any]):
    """The samples of a dataset given ``fields=``, holding their collated columns (module docstring).

    ``images``: an optional uint8 (N, H, W, 3) batch buffer holding the image column.
    """

    def __init__(self, columns: Sequence[Any], names: Sequence[str], as_dict: bool) -> None:
        self.columns, self.names, self.as_dict = list(columns), tuple(names), as_dict
        count = len(self.columns[0]) if self.columns else 0
        rows = [tuple(_row(column, i) for column in self.columns) for i in range(count)]
        super().__init__([dict(zip(self.names, row)) for row in rows] if as_dict else rows)

    @classmethod
    def collate(cls, layout: Layout, samples: Sequence[Any], images: torch.Tensor | None = None) -> FieldBatch:
        """Collate ``samples`` (tuples or dicts, as ``layout`` assembles them); ``images`` replaces the image column."""
        columns = []
        for position, output in enumerate(layout.outputs):
            if output.role == "image" and images is not None:
                columns.append(images.permute(0, 3, 1, 2))  # N×3×H×W, channels_last memory
                continue
            key = output.name if layout.as_dict else position
            columns.append(collate_column(output, [sample[key] for sample in samples]))
        return cls(columns, [output.name for output in layout.outputs], layout.as_dict)

    def collated(self) -> Any:
        return dict(zip(self.names, self.columns)) if self.as_dict else list(self.columns)

    def __reduce__(self) -> tuple[Callable[..., FieldBatch], tuple[list[Any], tuple[str, ...], bool]]:
        return FieldBatch, (self.columns, self.names, self.as_dict)  # the columns only, not N rows of views
