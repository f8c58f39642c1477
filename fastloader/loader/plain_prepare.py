"""The warning when accelerate's own ``accelerator.prepare`` rebuilds a DataLoaderX.

``Accelerator.prepare_data_loader`` (what ``accelerator.prepare`` and Hugging Face's Trainer call) first
reads ``getattr(loader, "_is_accelerate_prepared", False)`` (accelerate 0.21+), then builds its
``DataLoaderShard`` over a plain torch ``DataLoader`` from the loader's attributes: the DataLoaderX
itself never runs again. That read is the one moment a DataLoaderX sees the rebuild, so DataLoaderX
answers it through :func:`read_prepared_flag`, which warns (once per loader) and answers as accelerate
expects. ``fastloader.integrations.accelerate.prepare`` calls the same accelerate function to get
accelerate's sharding: it marks the loader with :func:`own_prepare` meanwhile, and no warning is given.

Why not keep the DataLoaderX on the unchanged line: the read gives no handle on the Accelerator (its
sharding configuration, its list of loaders, its checkpoint registry), and answering ``True`` would hand
the loader back unsharded, so every rank would read the whole dataset.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

_FLAG = "_fastloader_accelerate_prepared"  # a value someone assigned to _is_accelerate_prepared
_OWN = "_fastloader_own_prepare"  # fastloader's prepare is under way
_WARNED = "_fastloader_plain_prepare_warned"

MESSAGE = (
    "accelerator.prepare() (accelerate's, also Hugging Face Trainer's) rebuilds this DataLoaderX as accelerate's"
    " DataLoaderShard over a plain torch DataLoader: no prefetch thread, no side-stream copy, no stats(), and on"
    " a GPU no normalize= / random_flip= / channels_last= after the copy and no decode_on='cuda'. To keep the"
    " DataLoaderX, use fastloader.integrations.accelerate.prepare(accelerator, *objects) in its place"
)


def read_prepared_flag(loader: Any) -> bool:
    """``loader._is_accelerate_prepared``: what was assigned to it, else False, with the warning unless
    fastloader's own prepare is reading it."""
    state = loader.__dict__
    if _FLAG in state:
        return bool(state[_FLAG])
    if not state.get(_OWN) and not state.get(_WARNED):
        state[_WARNED] = True
        warnings.warn(MESSAGE, UserWarning, stacklevel=6)  # the accelerator.prepare(...) line
    return False


def write_prepared_flag(loader: Any, value: Any) -> None:
    loader.__dict__[_FLAG] = value


@contextlib.contextmanager
def own_prepare(loader: Any) -> Iterator[None]:
    """While fastloader's accelerate integration has accelerate shard ``loader``: no warning."""
    loader.__dict__[_OWN] = True
    try:
        yield
    finally:
        loader.__dict__.pop(_OWN, None)
