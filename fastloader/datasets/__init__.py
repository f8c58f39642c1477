"""Datasets that feed DataLoaderX: each is a random-access ``(image, label)`` dataset over a source.

They run in the DataLoader's worker processes: read an item's bytes from the source, hand them to the
image path (``fastloader.image``) and the transform, and follow the error policy for bad samples.

Every dataset here is an :class:`ImageDataset` over a *source* (encoded bytes, label and key of
item i), so any of them can be swapped for another; see ``fastloader.datasets.base`` for the
protocol a custom source implements. Given ``fields=``, items also carry what the samples hold
(captions, JSON, masks, boxes, ...: ``fastloader.fields``).
"""

from fastloader.datasets.base import ImageDataset, Source
from fastloader.datasets.folder import FileListDataset, FileListSource, FolderSource, ImageFolder
from fastloader.datasets.lmdb import LMDBDataset, LMDBSource
from fastloader.datasets.parquet import ParquetDataset, ParquetSource
from fastloader.datasets.recordio import RecordIODataset, RecordIOSource
from fastloader.datasets.tar import TarShardDataset, TarShardSource
from fastloader.datasets.tfrecord import TFRecordDataset, TFRecordSource

__all__ = [
    "FileListDataset",
    "FileListSource",
    "FolderSource",
    "ImageDataset",
    "ImageFolder",
    "LMDBDataset",
    "LMDBSource",
    "ParquetDataset",
    "ParquetSource",
    "RecordIODataset",
    "RecordIOSource",
    "Source",
    "TFRecordDataset",
    "TFRecordSource",
    "TarShardDataset",
    "TarShardSource",
]
