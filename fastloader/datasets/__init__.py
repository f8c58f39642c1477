"""Datasets that feed DataLoaderX: each is a random-access ``(image, label)`` dataset over a source.

See ``fastloader.datasets.base`` for the protocol a custom source implements.
"""

from fastloader.datasets.base import ImageDataset, Source

__all__ = ["ImageDataset", "Source"]
