"""Walk the nested containers a batch can be made of, applying a function to every tensor.

Batches are whatever ``collate_fn`` returns: tensors inside dicts, lists, tuples, namedtuples and
dataclasses, mixed with non-tensors (paths, ids) that must pass through untouched.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

TensorFn = Callable[[torch.Tensor], torch.Tensor]


def map_tensors(obj: Any, fn: TensorFn) -> Any:
    """Return ``obj`` with every tensor replaced by ``fn(tensor)``, keeping container types."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (str, bytes)):
        return obj
    if isinstance(obj, Mapping):
        items = {key: map_tensors(value, fn) for key, value in obj.items()}
        try:
            return type(obj)(items)  # type: ignore[call-arg]  # OrderedDict, defaultdict-free subclasses, BatchFeature-like
        except TypeError:
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(value, fn) for value in obj))
    if isinstance(obj, (list, tuple)):
        values = [map_tensors(value, fn) for value in obj]
        return values if type(obj) is list else type(obj)(values)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # copy + setattr also works for frozen dataclasses and fields with init=False.
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):
            object.__setattr__(new, field.name, map_tensors(getattr(obj, field.name), fn))
        return new
    return obj


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Yield every tensor inside ``obj`` (same traversal as :func:`map_tensors`)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (str, bytes)):
        return
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from iter_tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from iter_tensors(value)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, field.name))
