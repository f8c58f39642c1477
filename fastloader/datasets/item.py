"""What every route of an :class:`~fastloader.datasets.base.ImageDataset` shares about one item: its index,
checked (:func:`check_index`, also every source's), and its decoded pixels as the tensor an item holds
(:func:`item_tensor`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


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


def item_tensor(image: Any) -> Any:
    """H×W×3 pixels as a C×H×W tensor (a view); anything else (an encoded image, None) as it is."""
    return torch.from_numpy(image).permute(2, 0, 1) if isinstance(image, np.ndarray) else image
