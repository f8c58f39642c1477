"""Image folders and file lists: torchvision's ``ImageFolder``, without its list of 10M tuples.

``ImageFolder(root)`` finds the same classes, ``class_to_idx`` and samples, in the same order, as
``torchvision.datasets.ImageFolder(root)``, but keeps them in a persisted, memory-mapped index (see
``fastloader.datasets.folder_index``): the tree is scanned once, in parallel, and every later run
and every rank loads the index in milliseconds. Nothing per-sample lives in a Python object, so a
worker touching every sample copies nothing.

``FileListDataset(list_path)`` reads ``path label`` lines (or rows of a ``.csv`` / ``.tsv``, whose
other columns are text fields), indexed and persisted the same way.

Differences from torchvision, all deliberate:

* ``samples`` / ``imgs`` are a lazy read-only sequence of ``(path, label)`` and ``targets`` a
  read-only int64 numpy array; to take a subset use ``torch.utils.data.Subset``.
* ``find_classes`` / ``make_dataset`` cannot be overridden (the scan runs in threads, once).
* A directory symlinked to one of its ancestors (or to the root) is not followed: os.walk follows
  it until ``ELOOP``, listing the same files dozens of times.
* FIFOs, devices and sockets are not samples, whatever their names: skipped when indexing (logged,
  counted in ``source.not_regular``), never opened (opening a FIFO waits for a writer forever). A file
  list naming one gives an error naming it when that item is read.
* With ``loader=None`` the image is decoded from the file's bytes to RGB (``decode_pil``); a
  ``loader`` keeps torchvision's contract ``loader(path) -> image``.
"""

from __future__ import annotations

import errno
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from fastloader.datasets.base import ImageDataset, check_index
from fastloader.datasets.confine import check_inside, outside, real_root
from fastloader.datasets.file_list_index import parse_file_list
from fastloader.datasets.folder_index import (
    FOLDER_KIND,
    FORMAT_VERSION,
    IMG_EXTENSIONS,
    LIST_KIND,
    LIST_SETTINGS,
    RACY_NS,
    IndexMeta,
    check_lengths,
    default_index_path,
    filter_settings,
    load_or_build,
    scan_folder,
)
from fastloader.datasets.handles import ProcessLocal
from fastloader.errors import FormatError, MissingField
from fastloader.fields.specs import Spec
from fastloader.formats.index_file import IndexFile, read_index, string_at
from fastloader.storage import check_regular_file, read_regular_file
from fastloader.timing import timed

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class _Entries:
    """The per-sample arrays of an index, memory-mapped (plain ndarray views: faster to index)."""

    keys: np.ndarray
    key_offsets: np.ndarray
    labels: np.ndarray
    fields: tuple[tuple[np.ndarray, np.ndarray], ...] = ()  # a file list's text columns: (blob, offsets) each


def _open_entries(index_path: str, kind: str, samples_digest: str) -> _Entries:
    index = read_index(index_path, kind, FORMAT_VERSION)
    check_lengths(index)
    if IndexMeta.of(index).samples_digest != samples_digest:
        # The tree changed and the index was rebuilt after our dataset was made: reading it would
        # silently shift samples. (A rebuild listing the same samples has the same id.)
        raise FormatError(
            f"{index_path}: the folder changed and its index was rebuilt after this dataset was made; make it again"
        )
    arrays = index.arrays
    fields = tuple(
        (np.asarray(arrays[f"field{number}"]), np.asarray(arrays[f"field{number}_offsets"]))
        for number in range(len(IndexMeta.of(index).fields))
    )
    return _Entries(np.asarray(arrays["keys"]), np.asarray(arrays["key_offsets"]), np.asarray(arrays["labels"]), fields)


class _IndexedFiles:
    """Random access to the files an index lists: the Source protocol shared by both sources.

    Pickling carries the index path, not the arrays: each process maps the index itself.
    """

    root: str
    index_path: str
    confine: bool = False
    _inside: str = ""

    def _attach(self, index: IndexFile, kind: str, confine: bool) -> None:
        self.confine = confine
        self._inside = real_root(self.root)  # resolved once: a root that is itself a link is the user's own
        samples_digest = IndexMeta.of(index).samples_digest
        self._length = len(index.arrays["key_offsets"]) - 1
        self._entries = ProcessLocal(functools.partial(_open_entries, self.index_path, kind, samples_digest))

    def __len__(self) -> int:
        return self._length

    def key(self, index: int) -> str:
        """The path as indexed: relative to ``root`` (or absolute, in a file list)."""
        index = check_index(index, self._length)
        entries = self._entries.get()
        return string_at(entries.keys, entries.key_offsets, index)

    def path(self, index: int) -> str:
        """The absolute path of item ``index``."""
        return os.path.join(self.root, self.key(index))

    def outside(self, index: int) -> str | None:
        """Item ``index``'s real path when it lies outside the root (a symbolic link, ``../``, an absolute
        path in a list), else None: what ``pack`` and ``scan`` count, and ``confine`` refuses."""
        return outside(self.path(index), self._inside)

    def check_confined(self, index: int) -> None:
        """Under ``confine``, raise :class:`~fastloader.errors.OutsideRoot` naming item ``index`` when it
        leads outside the root (see ``fastloader.datasets.confine``); else nothing, at no cost."""
        if self.confine:
            check_inside(self.key(index), self.path(index), self._inside)

    def label(self, index: int) -> int:
        return int(self._entries.get().labels[check_index(index, self._length)])

    def labels(self) -> np.ndarray:
        """Every label, int64, read-only and memory-mapped."""
        return self._entries.get().labels

    def content_identity(self, index: int) -> bytes | None:
        """What changes whenever the file's content does: its size, mtime_ns, ctime_ns, inode and device (one
        ``stat``; the decoded cache serves its pixels only under it). None, not to be trusted, when the file
        is missing or was modified less than ``RACY_NS`` ago: an edit within the same clock tick would keep
        the mtime (see ``folder_index``)."""
        try:
            self.check_confined(index)  # no identity for what confine refuses: the read that follows says why
            found = os.stat(self.path(index))
        except (OSError, ValueError):  # the read that follows names the error
            return None
        if time.time_ns() - found.st_mtime_ns < RACY_NS:
            return None
        fields = (found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino, found.st_dev)
        return b"|".join(str(field).encode() for field in fields)

    def read(self, index: int) -> bytes:
        path = self.path(index)
        try:
            self.check_confined(index)
            return read_regular_file(path)  # a FIFO or a device in a file list: an error naming it, not a hang
        except ValueError:  # a NUL byte: no file is named so (a corrupt index, or list)
            raise FormatError(f"{path!r} is not a file name (listed in {self.index_path})") from None
        except OSError as error:
            if error.errno is None:  # OutsideRoot among them: its message names the sample already
                raise
            # Name the index too: the file was there when it was built (or the list is wrong).
            raise type(error)(error.errno, f"{error.strerror} (listed in {self.index_path})", path) from None


class FolderSource(_IndexedFiles):
    """The images of a class-per-directory tree ``root/<class>/**/<file>``, as torchvision finds them.

    ``key(i)`` is the path relative to ``root``; labels are class positions in sorted ``classes``.
    The index is read from ``index_path`` (default: beside ``root``, see ``folder_index``) and
    rebuilt when the tree changed or ``rebuild=True``; ``scan_workers`` threads scan and check it.
    ``confine``: refuse to read a sample whose real path leaves ``root`` (``fastloader.datasets.confine``).
    """

    def __init__(
        self,
        root: PathLike,
        *,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        index_path: PathLike | None = None,
        rebuild: bool = False,
        scan_workers: int | None = None,
        confine: bool = False,
    ) -> None:
        scan_root = os.path.expanduser(os.fspath(root))
        if not os.path.isdir(scan_root):
            raise FileNotFoundError(errno.ENOENT, "no such image folder", scan_root)
        settings = filter_settings(is_valid_file)
        self.root = os.path.abspath(scan_root)
        self.index_path = os.fspath(index_path) if index_path is not None else default_index_path(self.root)
        scan = functools.partial(scan_folder, scan_root, is_valid_file, settings, scan_workers)
        identity = (os.path.realpath(scan_root), settings)
        index = load_or_build(self.index_path, FOLDER_KIND, identity, scan, rebuild, scan_workers)
        meta = IndexMeta.of(index)
        self.classes: list[str] = list(meta.classes)
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(self.classes)}
        # FIFOs, devices and sockets in the tree: skipped, never opened (the first few named in the index).
        self.not_regular: int = meta.not_regular
        counts = index.arrays["class_counts"].tolist()
        empty = sorted(name for name, count in zip(self.classes, counts) if count == 0)
        if empty and not allow_empty:
            message = f"Found no valid file for the classes {', '.join(empty)}. "
            if is_valid_file is None:
                message += f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}"
            raise FileNotFoundError(f"{self.root}: {message}")
        self._attach(index, FOLDER_KIND, confine)


class FileListSource(_IndexedFiles):
    """The images a list file names, with their labels and text fields.

    * ``*.txt`` (any name but the two below): ``path label`` lines, the label the last word, the
      path everything before it (spaces included). No other columns.
    * ``*.csv`` (commas, quoted as Excel does) and ``*.tsv`` (tabs, no quoting: a cell is what lies
      between two tabs): ``path,label`` rows, or any columns under a header row, told from data by
      its second cell not being an integer. Under a header the path is the column named ``path``
      and the label the column named ``label`` (none: every label is -1, for image-text lists),
      or, when no column is named ``path``, the first two columns; every other column is a *text
      field* named by its header (``fastloader.fields``; no column may be named ``image``, and
      ``label`` is the label). Cells are kept exactly as written, spaces included, and an empty
      cell is the empty text ``""``, not a missing field. A cell that is not UTF-8 fails when read,
      naming the item and field. Without a header, rows must have exactly two cells.

    Text fields live in the memory-mapped index, one bytes blob and offsets per column: no
    per-sample Python objects. Relative paths are joined to ``root`` (default: the list file's
    directory). ``classes``, when given, names the integer labels (each must be a valid position in
    it). Missing image files are reported when read, naming the path; the list is not checked file
    by file at construction. ``confine``: refuse to read an entry whose real path leaves ``root``
    (``../``, an absolute path, a symbolic link: see ``fastloader.datasets.confine``).
    """

    def __init__(
        self,
        list_path: PathLike,
        root: PathLike | None = None,
        *,
        classes: Sequence[str] | None = None,
        index_path: PathLike | None = None,
        rebuild: bool = False,
        confine: bool = False,
    ) -> None:
        self.list_path = os.path.abspath(os.path.expanduser(os.fspath(list_path)))
        if not os.path.isfile(self.list_path):
            raise FileNotFoundError(errno.ENOENT, "no such file list", self.list_path)
        base = os.path.dirname(self.list_path) if root is None else os.path.expanduser(os.fspath(root))
        self.root = os.path.abspath(base)
        self.index_path = os.fspath(index_path) if index_path is not None else default_index_path(self.list_path)
        parse = functools.partial(parse_file_list, self.list_path)
        identity = (os.path.realpath(self.list_path), LIST_SETTINGS)
        index = load_or_build(self.index_path, LIST_KIND, identity, parse, rebuild)
        low, high = index.arrays["label_range"].tolist()
        self.classes: list[str] | None = None if classes is None else list(classes)
        self.class_to_idx: dict[str, int] | None = None
        if self.classes is not None:
            if low < 0 or high >= len(self.classes):
                raise ValueError(
                    f"{self.list_path}: labels run from {low} to {high}, outside the {len(self.classes)} classes given"
                )
            self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        meta = IndexMeta.of(index)
        self.fields: tuple[str, ...] = meta.fields
        self._label_column = meta.label_column
        self._field_numbers = {name: number for number, name in enumerate(self.fields)}
        self._attach(index, LIST_KIND, confine)

    def field_kinds(self) -> dict[str, str]:
        """The list's text columns (``{}`` for ``path label`` lines)."""
        return dict.fromkeys(self.fields, "text")

    def field_aliases(self) -> dict[str, str]:
        """The header's name of the label column."""
        return {} if self._label_column is None else {self._label_column: "label"}

    def read_field(self, index: int, name: str) -> str:
        """Item ``index``'s cell in the column ``name``."""
        index = check_index(index, self._length)
        number = self._field_numbers.get(name)
        if number is None:
            known = ", ".join(self.fields) or "none"
            raise MissingField(f"{self.key(index)}: no field {name!r} (the list's text columns: {known})")
        blob, offsets = self._entries.get().fields[number]
        data = blob[int(offsets[index]) : int(offsets[index + 1])].tobytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FormatError(f"{self.key(index)}: field {name!r}: not UTF-8 text ({error})") from None


class SampleView(Sequence[tuple[str, int]]):
    """torchvision's ``samples`` list of ``(path, label)``, computed on access instead of stored."""

    def __init__(self, source: _IndexedFiles, root: str) -> None:
        self._source = source
        self._root = root

    def __len__(self) -> int:
        return len(self._source)

    @overload
    def __getitem__(self, index: int) -> tuple[str, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, int]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, int] | list[tuple[str, int]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = check_index(index, len(self._source))
        return os.path.join(self._root, self._source.key(index)), self._source.label(index)

    def __repr__(self) -> str:
        return f"SampleView({len(self)} samples under {self._root!r})"


def _describe(dataset: ImageFolder | FileListDataset, where: str) -> str:
    return f"Dataset {type(dataset).__name__}\n    Number of datapoints: {len(dataset)}\n    {where}"


class _PathDataset(ImageDataset[Any]):
    """A dataset of image files whose ``loader(path)`` (torchvision's contract), when given, reads and
    decodes each image instead of fastloader's decode of the file's bytes."""

    loader: Callable[[str], Any] | None
    source: _IndexedFiles

    @property
    def samples(self) -> SampleView:
        raise NotImplementedError

    def _image(self, index: int) -> Any:
        if self.loader is None:
            return super()._image(index)
        path = self.samples[index][0]
        self.source.check_confined(index)  # the user's loader follows links as any open does
        check_regular_file(path)  # the user's loader would open a FIFO blindly, and wait forever
        with timed("decode"):  # the user's loader reads and decodes in one call
            return self.loader(path)

    def _decodes_bytes(self) -> bool:
        return self.loader is None and super()._decodes_bytes()


class ImageFolder(_PathDataset):
    """A drop-in for ``torchvision.datasets.ImageFolder`` over a persisted index (see module docstring).

    Extras, keyword-only: ``index_path`` (where the index lives), ``rebuild`` (rescan even if the
    index looks current), ``scan_workers`` (threads scanning the class directories), ``confine``
    (refuse a sample whose real path, its symbolic links resolved, leaves ``root``: an
    :class:`~fastloader.errors.OutsideRoot` naming it when read, one bad sample under the error policy).
    """

    source: FolderSource

    def __init__(
        self,
        root: PathLike,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        loader: Callable[[str], Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        index_path: PathLike | None = None,
        rebuild: bool = False,
        scan_workers: int | None = None,
        confine: bool = False,
    ) -> None:
        source = FolderSource(
            root,
            is_valid_file=is_valid_file,
            allow_empty=allow_empty,
            index_path=index_path,
            rebuild=rebuild,
            scan_workers=scan_workers,
            confine=confine,
        )
        super().__init__(source, transform, target_transform)
        self.root = os.path.expanduser(root) if isinstance(root, str) else root
        self.loader = loader  # torchvision's contract: loader(path) -> image; None: decode the file's bytes
        self.extensions = IMG_EXTENSIONS if is_valid_file is None else None
        self.classes = source.classes
        self.class_to_idx = source.class_to_idx
        # Sample paths are spelled as torchvision spells them: the root as given, user-expanded.
        self._sample_root = os.path.expanduser(os.fspath(root))

    @property
    def samples(self) -> SampleView:
        return SampleView(self.source, self._sample_root)

    @property
    def imgs(self) -> SampleView:
        return self.samples

    @property
    def targets(self) -> np.ndarray:
        return self.source.labels()

    def __repr__(self) -> str:
        return _describe(self, f"Root location: {self.root}")


class FileListDataset(_PathDataset):
    """``(image, label)`` for each entry of a list file (see :class:`FileListSource`).

    ``loader``: None decodes the file's bytes to RGB; a callable is called as ``loader(path)``.
    ``fields``: samples with more than a label, the text columns of a ``.csv`` / ``.tsv`` by their
    header names (``fields=("image", "caption")``: tuple items; a mapping: dict items; see
    ``fastloader.fields``). ``confine``: refuse an entry whose real path leaves ``root`` (``../``, an
    absolute path, a symbolic link): an :class:`~fastloader.errors.OutsideRoot` naming it when read.
    """

    source: FileListSource

    def __init__(
        self,
        list_path: PathLike,
        root: PathLike | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        classes: Sequence[str] | None = None,
        loader: Callable[[str], Any] | None = None,
        index_path: PathLike | None = None,
        rebuild: bool = False,
        fields: Sequence[Spec] | Mapping[str, Spec] | None = None,
        confine: bool = False,
    ) -> None:
        source = FileListSource(
            list_path, root, classes=classes, index_path=index_path, rebuild=rebuild, confine=confine
        )
        super().__init__(source, transform, target_transform, fields=fields)
        self.root = source.root
        self.loader = loader  # called as loader(path); None: decode the file's bytes
        self.classes = source.classes
        self.class_to_idx = source.class_to_idx

    @property
    def samples(self) -> SampleView:
        return SampleView(self.source, self.source.root)

    @property
    def targets(self) -> np.ndarray:
        return self.source.labels()

    def __repr__(self) -> str:
        return _describe(self, f"File list: {self.source.list_path}")
