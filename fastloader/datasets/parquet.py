"""Map-style access to images in Parquet files: ``ParquetDataset("data/train-*.parquet")``.

The layout most large image sets are published in (Hugging Face Hub image datasets, LAION-style
metadata): one row per sample, an image-bytes column, and caption / label / metadata columns.
Files are read with pyarrow (``pip install fastloader[parquet]``), memory-mapped.

Items are numbered through the files in pattern order (braces, then sorted globs; the sorted
``*.parquet`` of a directory; the files of a ``fastloader pack --format parquet`` directory, from
its manifest), and through each file's row groups. Only the footers are read to build the index: a
numpy array of where each row group starts, so item ``i`` is found with ``np.searchsorted`` and no
per-sample Python object is kept.

Costs: Parquet decodes a column a row group at a time, so reading one row reads its row group's
column chunk. Each process keeps the last ``cache_row_groups`` row groups it read (the columns asked
for: image, label, a field), so sequential and shard-aware access read each row group once, while
uniformly random access over a large dataset reads a whole row group per item. Shuffle with
``fastloader.samplers.ShardWindowSampler(dataset, window=cache_row_groups)``: ``shard_starts()``
gives it the row groups, which it then reads in windows. At most ``_MAX_OPEN_FILES`` files are open
per process.

Memory: one column of one row group may decode to at most ``max_decode_bytes`` (256 MiB by default).
A few KB of dictionary-encoded, delta-encoded or compressed Parquet can decode to gigabytes while its
footer announces kilobytes. So the sizes the footer and the dictionary page's header announce are
checked before anything is decoded; a string or binary column with a dictionary is read as one (each
value once, however many rows refer to it); the rest is counted as it decodes, in batches of rows sized
so that one batch stays small whatever a row holds. Past the limit a read is a FormatError naming the
file, row group, column and size (a genuine row group that large needs a larger ``max_decode_bytes``),
and that column chunk is refused again at once for every row of it, never decoded again. Any other
damage (a footer, schema metadata or page that does not parse, a column name changed, a value no writer
stores) is a FormatError naming the file and, where the read got that far, the row.

Columns:

* the image: ``image_column``, else the one our own packs name, else a Hugging Face ``Image``
  feature (``struct<bytes: binary, path: string>``: its ``bytes``, or where they are null the file
  at its ``path``, read as ``datasets`` reads it: see ``fastloader.datasets.parquet_paths``; ``root=``
  for a set moved elsewhere), else a binary column named ``image``, ``jpg``, ``jpeg``, ``png``,
  ``webp`` or ``img``.
* the label: ``label_column``, else an integer column named ``label``, ``labels``, ``cls`` or
  ``class``; without one (or for a null) ``label(i)`` is -1. Class names come from a Hugging Face
  ``ClassLabel`` or a pack's manifest.
* the key: ``key_column``, else a string column named ``key``, ``__key__`` or ``id``; without one
  ``key(i)`` is ``"<file>#<row in file>"`` (``location(i)`` always is).
* every other column is a field (``fastloader.fields``), of the kind its Arrow type says: binary ->
  bytes (a second Hugging Face image -> image), string -> text, integers and bool -> int, floats ->
  float, lists of numbers -> array (1-D, of the list's value type), structs, maps and other lists ->
  json, dates / times / decimals -> text (``str`` of the value). Columns of other types (null,
  union) are not fields. A null is a :class:`~fastloader.errors.MissingField` naming the key
  and column. Files written by ``fastloader pack --format parquet`` say in their schema metadata
  what each column holds (``fastloader.formats.parquet_pack``), which wins: names, kinds and values
  read back exactly as packed.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from fastloader.datasets.base import ImageDataset, check_index
from fastloader.datasets.handles import OpenHandles, ProcessLocal
from fastloader.datasets.parquet_columns import NULL, Column, Layout, cell_value, file_layout
from fastloader.datasets.parquet_paths import ImagePaths
from fastloader.errors import FormatError, MissingField
from fastloader.fields.specs import Spec
from fastloader.formats.parquet_footer import PAGE_HEADER_BYTES, ChunkSizes, dictionary_page_size, read_chunk_sizes
from fastloader.formats.parquet_pack import ParquetPackState, import_pyarrow
from fastloader.formats.patterns import expand_pattern
from fastloader.image.pil import decode_pil

_MAX_OPEN_FILES = 64  # memory maps (each holds a descriptor) per process; others are reopened as needed
DEFAULT_CACHE_ROW_GROUPS = 4  # ShardWindowSampler's default window
DEFAULT_MAX_DECODE_BYTES = 256 << 20  # what one column of one row group may decode to (see _OpenFiles.decode)
_CACHE_BYTES = 512 << 20  # decoded row groups kept per process, at most (the latest one always)
# Rows decoded at a time: as many as fit _BATCH_BYTES (see _OpenFiles._decode), 65536 at most.
_BATCH_BYTES, _MAX_BATCH_ROWS = 16 << 20, 65536
_DICTIONARY_READS = ("binary", "text", "json_text", "npy")  # top-level string and binary columns (Column.how)


def _file_list(pattern: str | os.PathLike[str] | list[str]) -> tuple[list[str], list[str] | None, dict[str, str]]:
    """The files a pattern names, the class names and fields a pack's manifest records."""
    if not isinstance(pattern, list) and os.path.isdir(pattern):
        directory = os.fspath(pattern)
        if ParquetPackState.found_in(directory):
            state = ParquetPackState.read_manifest(directory)
            return [os.path.join(directory, shard.name) for shard in state.shards], state.classes, state.fields
        # As pyarrow and Spark do, names starting with "." or "_" are not data (temporaries, _SUCCESS).
        files = sorted(n for n in os.listdir(directory) if n.endswith(".parquet") and not n.startswith((".", "_")))
        if not files:
            raise FileNotFoundError(f"{directory}: no *.parquet file in this directory")
        return [os.path.join(directory, name) for name in files], None, {}
    return expand_pattern(pattern), None, {}


def _unreadable(path: str, error: BaseException) -> FormatError:
    return FormatError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})")


def _footer(
    path: str, image_column: str | None, label_column: str | None, key_column: str | None
) -> tuple[Layout, list[int]]:
    """The layout of the file at ``path`` and its row groups' row counts, from its footer."""
    pa, pq = import_pyarrow()
    try:
        metadata = pq.read_metadata(path)
        schema = metadata.schema.to_arrow_schema()
        rows = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    except (OSError, ValueError, pa.ArrowException) as error:  # ArrowNotImplementedError, a name not UTF-8, ...
        raise _unreadable(path, error) from None
    if any(count < 0 for count in rows):
        raise FormatError(f"{path}: not a readable Parquet file (its footer counts {min(rows)} rows in a row group)")
    return file_layout(path, schema, image_column, label_column, key_column), rows


def footer_rows(path: str) -> int:
    """The rows the footer of the Parquet file at ``path`` counts; a FormatError naming it when it cannot
    be read (pyarrow raises OSError, ArrowInvalid, ArrowNotImplementedError, UnicodeDecodeError...)."""
    pa, pq = import_pyarrow()
    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, ValueError, pa.ArrowException) as error:
        raise _unreadable(path, error) from None


def _close(opened: tuple[Any, Any, Any]) -> None:
    opened[1].close()  # the memory map; buffers still in use keep their mapping


class _OpenFiles:
    """Per process: the memory-mapped files and the row groups last read (see the module docstring)."""

    def __init__(self, paths: list[str], cache_row_groups: int, verify_checksums: bool, max_decode: int) -> None:
        self._paths, self._keep, self._verify, self._max_decode = paths, cache_row_groups, verify_checksums, max_decode
        self._files = OpenHandles(self._open, _close, _MAX_OPEN_FILES)  # file -> (ParquetFile, memory map, ...)
        self._groups: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()  # -> column -> ChunkedArray
        self._chunk_sizes: dict[int, list[list[ChunkSizes]]] = {}  # file -> what its footer says of each chunk
        self._refused: dict[tuple[int, int, str], str] = {}  # (file, row group, column) -> why
        self.reads = 0  # column chunks read (row group x column), for cache_info()

    def parquet_file(self, file: int) -> Any:
        return self._files.get(file)[0]

    def _open(self, file: int) -> tuple[Any, Any, dict[str, Any]]:
        pa, pq = import_pyarrow()
        path = self._paths[file]
        try:
            mapped = pa.memory_map(path)
        except (OSError, pa.ArrowException) as error:
            raise _unreadable(path, error) from None
        try:
            parquet = pq.ParquetFile(mapped, page_checksum_verification=self._verify)
        except (OSError, ValueError, pa.ArrowException) as error:
            mapped.close()
            raise _unreadable(path, error) from None
        except BaseException:
            mapped.close()
            raise
        return parquet, mapped, {}  # the readers of dictionary columns as dictionaries, by column

    def column(self, file: int, group: int, spec: Column, rows: int) -> Any:
        """The column of ``spec`` in row group ``group`` of ``file`` (``rows`` rows), read once; a
        FormatError saying why when it cannot be."""
        entry = self._groups.get((file, group))
        if entry is not None:
            self._groups.move_to_end((file, group))
            if spec.column in entry:
                return entry[spec.column]
        array = self.decode(file, group, spec, rows)
        self.reads += 1
        if entry is None:
            entry = self._groups[(file, group)] = {}
        entry[spec.column] = array
        self._evict()
        return array

    def decode(self, file: int, group: int, spec: Column, rows: int) -> Any:
        """The column chunk of ``spec`` in row group ``group`` of ``file``, within ``max_decode_bytes``; a
        FormatError naming the file, row group and column when it cannot be read, remembered: a chunk
        refused once is refused again at once, never decoded again (``scan`` asks for each of its rows)."""
        refused = self._refused.get((file, group, spec.column))
        if refused is not None:
            raise FormatError(refused)
        try:
            return self._decode(file, group, spec, rows)
        except FormatError as error:
            self._refused[(file, group, spec.column)] = str(error)
            raise

    def _decode(self, file: int, group: int, spec: Column, rows: int) -> Any:
        """Check what a column chunk will decode to, then decode it, refusing past ``max_decode_bytes``.

        A dictionary page, a delta encoding or compression can make a few KB of file decode to
        gigabytes. Before anything is decoded, the sizes the footer gives (every page uncompressed, the
        dictionary page counted once) and the one the dictionary page's own header gives must be within
        the limit (``fastloader.formats.parquet_footer`` reads them: pyarrow's own column chunk metadata
        aborts the process on some damaged footers). A string or binary column with a dictionary is read
        as one: its values once and an index per row, whatever number of rows refer to each value. The
        rest is decoded in batches of rows and counted after each one, as the footer is only the writer's
        word and a delta encoding decodes to more than its pages: memory stays within the limit and a batch.
        """
        pa, pq = import_pyarrow()
        parquet, mapped, dictionary_readers = self._files.get(file)
        path = self._paths[file]
        what = f"cannot read column {spec.column!r} of row group {group} in {path}"
        declared, dictionary, expands = self._announced(file, group, spec, what)
        limit = self._max_decode
        try:
            if dictionary and spec.how in _DICTIONARY_READS:
                reader = dictionary_readers.get(spec.column)
                if reader is None:
                    reader = dictionary_readers[spec.column] = pq.ParquetFile(
                        mapped, read_dictionary=[spec.column], page_checksum_verification=self._verify
                    )
                arrays = reader.read_row_group(group, columns=[spec.column], use_threads=False).column(0).chunks
                _check_decoded(what, limit, sum(array.nbytes for array in arrays), arrays, rows, declared)
            else:
                # Where values point back at others a row may be as large as its whole chunk, else as its
                # share of it: as many rows at a time as fit _BATCH_BYTES at that (all of a plain chunk
                # decodes to about what its pages hold, which the footer said is within the limit).
                row = declared if expands or dictionary else declared // max(1, rows)
                batch_rows = max(1, min(_MAX_BATCH_ROWS, _BATCH_BYTES // max(1, row)))
                batches = parquet.iter_batches(
                    batch_size=batch_rows, row_groups=[group], columns=[spec.column], use_threads=False
                )
                arrays, decoded = [], 0
                for batch in batches:
                    arrays.append(batch.column(spec.column))  # "a.b" may also bring a nested "a": by name
                    decoded += arrays[-1].nbytes
                    _check_decoded(what, limit, decoded, arrays, rows, declared)
            found = sum(map(len, arrays))
            if found != rows:
                raise FormatError(f"{what}: {found} values where its footer counts {rows} rows")
            array = pa.chunked_array(arrays)
        except FormatError:
            raise
        except (OSError, ValueError, KeyError, IndexError, pa.ArrowException) as error:  # a bad page, a file changed
            raise FormatError(f"{what} ({type(error).__name__}: {error})") from error
        return array

    def _announced(self, file: int, group: int, spec: Column, what: str) -> tuple[int, int, bool]:
        """What the footer says the chunk decodes to, what its dictionary pages' headers say (0: none), and
        whether an encoding of it expands; a FormatError past ``max_decode_bytes``, before anything is decoded."""
        _, mapped, _ = self._files.get(file)
        chunk_sizes = self._chunk_sizes.get(file)
        if chunk_sizes is None:
            read_at = lambda at, count: mapped.read_at(count, at)  # noqa: E731 (pyarrow's order is count, offset)
            chunk_sizes = self._chunk_sizes[file] = read_chunk_sizes(read_at, mapped.size(), self._paths[file])
        if group >= len(chunk_sizes):
            raise FormatError(f"{what}: its footer holds {len(chunk_sizes)} row groups")
        leaves = [chunk for chunk in chunk_sizes[group] if chunk.path[:1] == (spec.column,)]
        declared, dictionary = sum(chunk.uncompressed for chunk in leaves), 0
        for chunk in leaves:
            if chunk.first_page < mapped.size():
                header = mapped.read_at(min(PAGE_HEADER_BYTES, mapped.size() - chunk.first_page), chunk.first_page)
                dictionary += dictionary_page_size(header) or 0
        if max(declared, dictionary) > self._max_decode:
            whose = "its footer" if declared >= dictionary else "its dictionary page's header"
            raise FormatError(
                f"{what}: it decodes to more than max_decode_bytes={self._max_decode:,} bytes ({whose} says"
                f" {max(declared, dictionary):,}; refused before decoding): a file made to exhaust memory, or a"
                " row group too large for this limit (max_decode_bytes= raises it)"
            )
        return declared, dictionary, any(chunk.expands for chunk in leaves)

    def _evict(self) -> None:
        total = sum(array.nbytes for entry in self._groups.values() for array in entry.values())
        while len(self._groups) > 1 and (len(self._groups) > self._keep or total > _CACHE_BYTES):
            _, entry = self._groups.popitem(last=False)
            total -= sum(array.nbytes for array in entry.values())

    def info(self) -> dict[str, int]:
        return {
            "column_reads": self.reads,
            "cached_row_groups": len(self._groups),
            "open_files": len(self._files),
            "refused_column_chunks": len(self._refused),
        }


def _check_decoded(what: str, limit: int, decoded: int, arrays: list[Any], rows: int, declared: int) -> None:
    """A FormatError once what was decoded of a column chunk passes ``limit``."""
    if decoded > limit:
        raise FormatError(
            f"{what}: it decodes to more than max_decode_bytes={limit:,} bytes ({decoded:,} bytes by row"
            f" {sum(map(len, arrays)):,} of {rows:,}, where its footer gives {declared:,}): a file made to exhaust"
            " memory, or a row group too large for this limit (max_decode_bytes= raises it)"
        )


class ParquetSource:
    """A :class:`~fastloader.datasets.base.Source` and :class:`~fastloader.fields.source.FieldSource`
    over Parquet files (see the module docstring for the columns and the costs).

    ``pattern``: a file, a directory (its sorted ``*.parquet``, or a ``fastloader pack --format
    parquet`` output), a brace / glob pattern or a list. ``image_column`` / ``label_column`` /
    ``key_column``: which columns hold them (default: found as the module docstring says).
    ``cache_row_groups``: row groups each process keeps decoded. ``verify_checksums``: check the
    page checksums of files that have them (``fastloader verify`` does). ``max_decode_bytes``: what
    reading one column of one row group may decode to; past it a read is a FormatError naming the file,
    row group and column (a few KB of Parquet can decode to gigabytes: see the module docstring).
    ``root``: the directory a Hugging Face image's relative ``path`` is taken under, for rows that hold
    no bytes (default: the current directory when read, as ``datasets`` does; see
    ``fastloader.datasets.parquet_paths``). ``confine``: read no image by path from outside ``root``
    (``../``, absolute paths and symbolic links out are :class:`~fastloader.errors.OutsideRoot`).
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        *,
        image_column: str | None = None,
        label_column: str | None = None,
        key_column: str | None = None,
        cache_row_groups: int = DEFAULT_CACHE_ROW_GROUPS,
        verify_checksums: bool = False,
        max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES,
        root: str | os.PathLike[str] | None = None,
        confine: bool = False,
    ) -> None:
        for name, number in (("cache_row_groups", cache_row_groups), ("max_decode_bytes", max_decode_bytes)):
            if not isinstance(number, int) or number < 1:
                raise ValueError(f"{name} must be a positive integer, got {number!r}")
        import_pyarrow()
        self.image_paths = ImagePaths(root, confine)
        self.paths, pack_classes, pack_fields = _file_list(pattern)
        layouts: list[Layout] = []
        group_rows: list[int] = []
        first_group = [0]
        for path in self.paths:
            layout, rows = _footer(path, image_column, label_column, key_column)
            layouts.append(layout)
            group_rows.extend(rows)
            first_group.append(len(group_rows))
        for path, layout in zip(self.paths[1:], layouts[1:]):
            _check_same(self.paths[0], layouts[0], path, layout)
        self._layouts = layouts
        self._kinds = {n: c.kind for n, c in layouts[0].fields.items()} if layouts else dict(pack_fields)
        self.classes: list[str] | None = pack_classes or (layouts[0].classes if layouts else None)
        self._starts = np.concatenate([[0], np.cumsum(group_rows, dtype=np.int64)]).astype(np.int64)
        self._first_group = np.array(first_group, dtype=np.int64)
        self._group_file = np.repeat(np.arange(len(self.paths), dtype=np.int32), np.diff(self._first_group))
        self._file_starts = self._starts[self._first_group]  # the first item of each file
        self._length = int(self._starts[-1])
        self._local = ProcessLocal(
            partial(_OpenFiles, self.paths, cache_row_groups, verify_checksums, max_decode_bytes)
        )

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        groups = len(self._starts) - 1
        return f"{type(self).__name__}({self._length} rows in {len(self.paths)} files, {groups} row groups)"

    # -- where an item is -------------------------------------------------------------------------

    def shard_starts(self) -> np.ndarray:
        """Where each row group's items start, and the total at the end (for ShardWindowSampler)."""
        return self._starts.copy()

    def _locate(self, index: int) -> tuple[int, int, int]:
        """``(file, row group, row in the row group)`` of item ``index`` (row groups numbered across files)."""
        index = check_index(index, self._length)
        group = int(self._starts.searchsorted(index, "right")) - 1  # the method: np.searchsorted costs 2x
        return int(self._group_file[group]), group, index - int(self._starts[group])

    def location(self, index: int) -> str:
        """``"<file>#<row in the file>"``."""
        index = check_index(index, self._length)
        file = self._locate(index)[0]
        return f"{self.paths[file]}#{index - int(self._file_starts[file])}"

    def _name(self, index: int) -> str:
        """Item ``index`` in messages: ``"<file>#<row>"``, with its key in brackets where the file has one."""
        location = self.location(index)
        if self._layouts[self._locate(index)[0]].key is None:
            return location
        try:
            key = self.key(index)
        except FormatError:  # an unreadable key column: where the row is says enough
            return location
        return location if key == location else f"{location} ({key})"

    def _cell(self, file: int, group: int, row: int, spec: Column, where: Callable[[], str]) -> Any:
        """Row ``row`` of row group ``group`` in the column of ``spec`` (``NULL`` for a null)."""
        in_file = group - int(self._first_group[file])
        rows = int(self._starts[group + 1] - self._starts[group])
        try:
            array = self._local.get().column(file, in_file, spec, rows)
        except FormatError as error:  # it names the file, row group and column; where() the row
            raise FormatError(f"{where()}: {error}") from error
        return cell_value(spec, array, row, where)

    # -- the Source protocol ----------------------------------------------------------------------

    def read(self, index: int) -> bytes:
        file, group, row = self._locate(index)
        spec = self._layouts[file].image
        data = self._image_bytes(self._cell(file, group, row, spec, lambda: self._name(index)), spec, index)
        if data is None:
            raise FormatError(f"{self._name(index)}: no image (null in column {spec.column!r})")
        return data

    def _image_bytes(self, value: Any, spec: Column, index: int) -> bytes | None:
        """The bytes of an image cell (None for a null): a Hugging Face image's own, else its file's."""
        if value is NULL:
            return None
        if spec.how == "hf_image":
            return self.image_paths.read(value, lambda: f"{self._name(index)}: column {spec.column!r}")
        return bytes(value)

    def label(self, index: int) -> int:
        file, group, row = self._locate(index)
        spec = self._layouts[file].label
        if spec is None:
            return -1
        value = self._cell(file, group, row, spec, lambda: self._name(index))
        return -1 if value is NULL else int(value)

    def key(self, index: int) -> str:
        """The key column's value, else (or for a null) ``location(index)``."""
        file, group, row = self._locate(index)
        spec = self._layouts[file].key
        value = NULL if spec is None else self._cell(file, group, row, spec, lambda: self.location(index))
        return self.location(index) if value is NULL else str(value)

    def labels(self) -> np.ndarray:
        """Every label (-1 where there is none), read from each row group's label column (within the
        decode limit, and not kept: a label column is read once for the whole dataset)."""
        parts = [np.zeros(0, np.int64)]
        files = self._local.get()
        for group in range(len(self._starts) - 1):
            file = int(self._group_file[group])
            rows = int(self._starts[group + 1] - self._starts[group])
            spec = self._layouts[file].label
            if spec is None or rows == 0:
                parts.append(np.full(rows, -1, dtype=np.int64))
                continue
            array = files.decode(file, group - int(self._first_group[file]), spec, rows)
            parts.append(array.fill_null(-1).to_numpy().astype(np.int64))
        return np.concatenate(parts)

    # -- the FieldSource protocol -----------------------------------------------------------------

    def field_kinds(self) -> dict[str, str]:
        return dict(self._kinds)

    def field_aliases(self) -> dict[str, str]:
        """The image and label columns' names (``{"jpg": "image", "cls": "label"}``)."""
        if not self._layouts:
            return {}
        layout = self._layouts[0]
        aliases = {layout.image.column: "image"}
        if layout.label is not None:
            aliases[layout.label.column] = "label"
        return aliases

    def read_field(self, index: int, name: str) -> Any:
        file, group, row = self._locate(index)
        spec = self._layouts[file].fields.get(name)
        if spec is None:
            raise KeyError(f"no field {name!r} in these Parquet files (fields: {sorted(self._kinds)})")
        value = self._cell(file, group, row, spec, lambda: f"{self._name(index)}: field {name!r}")
        if spec.how == "hf_image":  # a second Hugging Face image: by path too
            value = self._image_bytes(value, spec, index)
            value = NULL if value is None else value
        if value is NULL:
            raise MissingField(f"{self.key(index)}: no field {name!r} (null in column {spec.column!r})")
        return value

    def cache_info(self) -> dict[str, int]:
        """This process's reads: column chunks read, row groups kept decoded, files open."""
        return self._local.get().info()


def _check_same(first_path: str, first: Layout, path: str, layout: Layout) -> None:
    """Every file must hold the same fields, and a label in all or none (FormatError naming both)."""
    kinds = {n: c.kind for n, c in first.fields.items()}
    other = {n: c.kind for n, c in layout.fields.items()}
    if kinds != other or (first.label is None) != (layout.label is None):
        raise FormatError(
            f"{path}: its columns differ from {first_path}'s: fields {other} and "
            f"{'a' if layout.label else 'no'} label, against {kinds} and {'a' if first.label else 'no'} label"
        )


class ParquetDataset(ImageDataset[Any]):
    """``(transform(image), target_transform(label))`` for each row of Parquet files (see :class:`ParquetSource`).

    ``fields``: samples with more than a label (``fields=("image", "caption", "label")``: see
    ``fastloader.datasets.base``); every column besides the image and label is a field, named as
    the column. Other keyword arguments are those of :class:`ParquetSource`. ``classes`` / ``class_to_idx`` come from
    a Hugging Face ``ClassLabel`` or a pack's manifest (None otherwise). Read in a shard-aware order
    (``fastloader.samplers.ShardWindowSampler(dataset)``) rather than uniformly at random: see the
    module docstring.
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        decode: Callable[[bytes, str], Any] = decode_pil,
        *,
        image_column: str | None = None,
        label_column: str | None = None,
        key_column: str | None = None,
        cache_row_groups: int = DEFAULT_CACHE_ROW_GROUPS,
        max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES,
        fields: Sequence[Spec] | Mapping[str, Spec] | None = None,
        root: str | os.PathLike[str] | None = None,
        confine: bool = False,
    ) -> None:
        source = ParquetSource(
            pattern,
            image_column=image_column,
            label_column=label_column,
            key_column=key_column,
            cache_row_groups=cache_row_groups,
            max_decode_bytes=max_decode_bytes,
            root=root,
            confine=confine,
        )
        super().__init__(source, transform, target_transform, decode, fields=fields)
