"""A source that answers as the source it wraps: the tests' sources that hold or log reads override ``read``."""

from __future__ import annotations

from typing import Any


class WrappedSource:
    """Every answer ``inner``'s (picklable as long as ``inner`` is: reader processes and Ray tasks get it)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def classes(self) -> Any:
        return self.inner.classes

    def __len__(self) -> int:
        return len(self.inner)

    def key(self, index: int) -> str:
        return str(self.inner.key(index))

    def label(self, index: int) -> int:
        return int(self.inner.label(index))

    def read(self, index: int) -> bytes:
        return bytes(self.inner.read(index))
