"""The one protocol every dataset is built on: a *source* of encoded images, decoded and transformed.

A source answers three questions about item ``i`` (``0 <= i < len(source)``): its encoded bytes
(JPEG, PNG, ... exactly as stored), its integer label, and a human-readable key (a path, an LMDB
key, a shard and member name) used in every error message. Plug in your own storage by writing
those four methods::

    class MySource:
        def __len__(self) -> int: ...
        def read(self, index: int) -> bytes: ...
        def label(self, index: int) -> int: ...
        def key(self, index: int) -> str: ...

    dataset = ImageDataset(MySource(...), transform=...)

Sources must hold no per-sample Python objects (at 10M samples each worker's refcount writes
would copy-on-write them into GBs): keep indexes in numpy arrays, ideally memory-mapped, and open
files / environments lazily in each process (see ``ProcessLocal``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np
from torch.utils.data import Dataset

from fastloader.errors import DecodeError

T = TypeVar("T")


@runtime_checkable
class Source(Protocol):
    """Random access to encoded images and their labels (see the module docstring)."""

    def __len__(self) -> int: ...

    def read(self, index: int) -> bytes: ...

    def label(self, index: int) -> int: ...

    def key(self, index: int) -> str: ...


def check_index(index: int, length: int) -> int:
    """Normalise a possibly negative index, raising IndexError outside ``[-length, length)``."""
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise TypeError(f"dataset indices must be integers, got {type(index).__name__}")
    index = int(index)
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for a dataset of {length} items")
    return index


def decode_pil(data: bytes, key: str = "<bytes>") -> Any:
    """Decode encoded image bytes to an RGB ``PIL.Image`` (grayscale, CMYK, palette, RGBA converted)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image: Image.Image = Image.open(io.BytesIO(data))
        image.load()
        if image.mode == "P" and "transparency" in image.info:
            image = image.convert("RGBA")  # the documented path for palette transparency (no warning)
        return image if image.mode == "RGB" else image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise DecodeError(f"{key}: cannot decode image ({type(error).__name__}: {error})") from error


class ImageDataset(Dataset[tuple[Any, Any]], Generic[T]):
    """A map-style dataset over a :class:`Source`: item i is ``(transform(image), target_transform(label))``.

    ``loader`` turns encoded bytes into an image (default: RGB ``PIL.Image``, as torchvision's
    ``ImageFolder``), so torchvision transforms work unchanged.
    """

    def __init__(
        self,
        source: Source,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        loader: Callable[[bytes, str], Any] = decode_pil,
    ) -> None:
        if not isinstance(source, Source):
            raise TypeError(f"source must provide __len__, read, label and key; got {type(source).__name__}")
        self.source = source
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        # A source may offer a richer ``target(i)`` than the int ``label(i)`` (RecordIO multi-label).
        self._target: Callable[[int], Any] = getattr(source, "target", source.label)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        index = check_index(index, len(self.source))
        image = self.loader(self.source.read(index), self.source.key(index))
        label = self._target(index)
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label


class ProcessLocal(Generic[T]):
    """A handle (file, mmap, LMDB environment) opened lazily, once per process.

    Handles must never cross a fork (two processes sharing one LMDB environment or file offset
    corrupt each other's reads), so the handle is reopened whenever the pid changes, and dropped
    when the owner is pickled for a spawned worker.
    """

    def __init__(self, opener: Callable[[], T]) -> None:
        self._opener = opener
        self._pid: int | None = None
        self._value: T | None = None

    def get(self) -> T:
        pid = os.getpid()
        if self._value is None or self._pid != pid:
            self._value = self._opener()
            self._pid = pid
        return self._value

    def __getstate__(self) -> dict[str, Any]:
        return {"_opener": self._opener, "_pid": None, "_value": None}
