"""``fastloader verify DST``: check a packed output end to end, naming every bad record.

For a fastloader LMDB:

1. The LMDB structure (every page, both meta pages, key order, the free list) is walked by
   py-lmdb's offline verifier (``lmdb.verify``, py-lmdb >= 3.0), which reads the file as bytes and
   so cannot be crashed by a corrupted page the way opening it through liblmdb could. A file that
   fails it is reported and not opened.
2. The metadata must be there (an incomplete pack or a foreign LMDB is a FormatError saying so).
3. Every record: its header, its CRC32C (over header, image and field bytes), its label against
   the labels record, and in a pack with fields its field table and every field, decoded as the
   kind the metadata gives it (a problem names the record and the field); record keys must run
   0 .. count - 1 with no gap, and every other key must be a reserved one.

For both tar and Parquet packs, the manifest first: it must be complete and its numbers agree (no
shard listed twice, counts and end positions that account for every source position: see
:mod:`fastloader.formats.pack_state`), each shard's count must match the shard's own (a tar shard's
index, a Parquet file's footer), no data file may lie beside it unrecorded, and the samples plus the
skipped items must be the items of the source it records (for an LMDB too).

For both, every data file is then read whole against the size and SHA-256 the manifest records
(``fastloader.pack.verify_content``): a flipped byte anywhere, an edited label, an appended member,
a file of another pack or two files swapped; in a tar shard, each changed, added or missing member
is named (from the digests its index recorded when packed). The manifest's class names must be
those of the source packed. A pack written before these hashes were recorded cannot be checked so,
and the report says so: it is not OK.

For a tar pack, each shard's index (offsets, sizes, labels, keys, the members of each sample) is then
compared with a scan of the shard's members, naming the first sample that differs, and with the digest
the manifest records of it (``fastloader.pack.verify_index``): an index shipped with edited labels or
swapped offsets fails, though its own meta names the shard's bytes.

For tar shards written by ``fastloader pack --format tar``: every sample must be readable, every
field member of every sample must decode as the kind the manifest records (a ``.json`` that is not
JSON, an ``.npy`` that is not an array), and the shards must hold no member extension the manifest
does not record.

For an MXNet RecordIO file (``FILE.rec``, not a pack fastloader writes): its index, checked entry by entry
against a walk of the file (``fastloader.pack.verify_recordio``).

For Parquet files written by ``fastloader pack --format parquet``: every row group must read with its
page checksums verified, every row must have an image, and every field value must decode as its
kind. Problems name the file and row, and the sample's key.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lmdb
import numpy as np

from fastloader.errors import FormatError, printable
from fastloader.formats import lmdb_records as records
from fastloader.formats.field_values import decode_value
from fastloader.formats.pack_state import PackState

_MAX_PROBLEMS = 10_000  # messages kept; bad_records lists every bad record regardless


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`~fastloader.pack.verify`: ``ok`` when ``problems`` is empty and records were checked
    (an empty pack is whole, but nothing to train on: never a success)."""

    path: str
    format: str  # "lmdb", "tar", "parquet" or "recordio"
    expected: int  # records the metadata announces
    checked: int  # records read and checked
    problems: tuple[str, ...] = ()
    bad_records: tuple[int, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.empty

    @property
    def empty(self) -> bool:
        return self.checked == 0 and self.expected == 0

    def format_text(self, limit: int = 20) -> str:
        if self.empty and not self.problems:
            from fastloader.pack.summary import report_path

            skipped = report_path(self.path)
            why = f" (its skipped items: {skipped})" if os.path.exists(skipped) else ""
            return f"FAILED: {self.path} ({self.format}) is empty: it holds no records{why}"
        if self.ok:
            return f"OK: {self.checked:,} records verified in {self.path} ({self.format})"
        lines = [f"FAILED: {len(self.problems):,} problems in {self.path} ({self.checked:,} records checked)"]
        lines += [f"  {printable(problem)}" for problem in self.problems[:limit]]  # problems name members
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit:,} more")
        return "\n".join(lines)


def _structure_problems(path: str) -> list[str]:
    try:
        from lmdb.verify import VerifyError
        from lmdb.verify import verify as verify_structure
    except ImportError:  # py-lmdb < 3.0 has no offline verifier: the record checks still run
        return []
    try:
        found: list[str] = verify_structure(path, subdir=os.path.isdir(path))
    except VerifyError as error:
        return [f"{path}: not a valid LMDB file ({error})"]
    return [f"{path}: LMDB structure: {problem}" for problem in found]


def _progress_bar(total: int, what: str, show: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="rec", desc=f"verify {what}", disable=not show, file=sys.stderr, dynamic_ncols=True)


class _LMDBCheck:
    """The record checks of one LMDB, gathering problems as it goes."""

    def __init__(
        self, path: str, txn: lmdb.Transaction, count: int, labels: np.ndarray, fields: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.path, self.txn, self.count, self.labels, self.fields = path, txn, count, labels, fields
        self.problems: list[str] = []
        self.bad: list[int] = []
        self.checked = 0

    def problem(self, message: str, number: int | None = None) -> None:
        if number is not None:
            self.bad.append(number)
            from fastloader.datasets.lmdb import source_key

            origin = source_key(self.txn, number)
            message = f"{self.path}[{number}]" + (f" ({origin})" if origin else "") + f": {message}"
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(message)

    def record(self, number: int, value: bytes | memoryview) -> None:
        try:
            header = records.parse_header(value, "record")
        except FormatError as error:
            self.problem(str(error).removeprefix("record: "), number)
            return
        if records.record_checksum(value) != header.checksum:
            self.problem("checksum mismatch: the record is corrupted", number)
        elif number >= self.count:
            self.problem(f"record beyond the {self.count} the metadata announces", number)
        elif header.label != self.labels[number]:
            self.problem(f"label {header.label} differs from the labels record ({self.labels[number]})", number)
        elif header.version >= records.FIELDS_RECORD_VERSION:
            self.record_fields(number, records.fields_section(value, header))

    def record_fields(self, number: int, section: memoryview) -> None:
        """Every field of a record decodes as its kind (the checksum vouches only for the bytes written)."""
        try:
            found = records.parse_fields(section, "record")
        except FormatError as error:
            self.problem(str(error).removeprefix("record: "), number)
            return
        for field_number, data in found.items():
            if field_number >= len(self.fields):
                self.problem(f"field number {field_number} is not one of the pack's {len(self.fields)} fields", number)
                continue
            name, kind = self.fields[field_number]
            try:
                decode_value(kind, data, f"field {name!r}")
            except FormatError as error:
                self.problem(str(error), number)

    def run(self, show_progress: bool) -> None:
        expected = 0
        with _progress_bar(self.count, self.path, show_progress) as bar:
            for raw_key, value in self.txn.cursor():
                key = bytes(raw_key)
                if not records.is_record_key(key):
                    if not key.startswith(records.RESERVED_PREFIX):
                        self.problem(f"{self.path}: unexpected key {key!r} (not a record, not reserved)")
                    continue
                number = records.record_number(key)
                if number != expected:
                    self.problem(f"{self.path}: records {expected}..{number - 1} are missing")
                self.record(number, value)
                self.checked += 1
                expected = number + 1
                bar.update(1)
        if expected < self.count:
            self.problem(f"{self.path}: {self.count} records announced, the last key is {expected - 1}")


def _verify_lmdb(path: str, show_progress: bool) -> VerifyReport:
    from fastloader.datasets.lmdb import shared_handle

    structure = _structure_problems(path)
    if structure:
        return VerifyReport(path, "lmdb", 0, 0, tuple(structure))
    try:
        handle = shared_handle(path)  # FormatError when incomplete, foreign or newer
        with handle.env.begin(buffers=True) as txn:
            check = _LMDBCheck(path, txn, handle.meta.count, handle.labels, handle.meta.fields)
            check.run(show_progress)
    except lmdb.Error as error:  # a structure the offline walk could not judge (or an older py-lmdb)
        return VerifyReport(path, "lmdb", 0, 0, (f"{path}: LMDB error while reading ({error})",))
    meta = handle.meta
    from fastloader.pack.verify_content import classes_problems

    problems = [*_source_count_problems(path, meta.fingerprint, meta.count, meta.num_skipped), *check.problems]
    problems += classes_problems(path, meta.fingerprint, meta.classes)
    return VerifyReport(path, "lmdb", meta.count, check.checked, tuple(problems), tuple(check.bad))


def _source_count_problems(path: str, fingerprint: dict[str, Any], packed: int, skipped: int) -> list[str]:
    """The pack against the source it records (``fingerprint["source"]["count"]``, as ``pack`` writes it):
    each source item is packed or skipped, as its summary says."""
    source = fingerprint.get("source")
    total = source.get("count") if isinstance(source, dict) else None
    if not isinstance(total, int) or total == packed + skipped:
        return []
    return [f"{path}: {packed} samples and {skipped} skipped, but the source packed held {total} items"]


def _file_count_problems(path: str, state: PackState, what: str, samples: Callable[[str], int]) -> list[str]:
    """Each data file the manifest records against the count its ``what`` (index, footer) gives: ``samples(file)``."""
    problems = []
    for shard in state.shards:
        file = os.path.join(path, shard.name)
        try:
            found = samples(file)
        except (OSError, ValueError) as error:  # FormatError is a ValueError; so is pyarrow's ArrowInvalid
            problems.append(f"{file}: unreadable {what} ({type(error).__name__}: {error})")
            continue
        if found != shard.count:
            problems.append(f"{file}: its {what} counts {found} samples, the manifest records {shard.count}")
    return problems


def _unrecorded_file_problems(path: str, state: PackState, suffix: str) -> list[str]:
    """Data files beside the manifest that it does not record (a reader of the directory would see them)."""
    recorded = {shard.name for shard in state.shards}
    return [
        f"{os.path.join(path, name)}: a data file the manifest does not record"
        for name in sorted(os.listdir(path))
        if name.endswith(suffix) and not name.startswith(".") and name not in recorded
    ]


def _manifest_problems(path: str, state: PackState, what: str, samples: Callable[[str], int], suffix: str) -> list[str]:
    """A shard manifest against the files beside it: each file's own count (its ``what``), the data files it does
    not record and the count of the source it was packed from."""
    problems = _file_count_problems(path, state, what, samples)
    problems += _unrecorded_file_problems(path, state, suffix)
    problems += _source_count_problems(path, state.fingerprint, state.count, len(state.skipped))
    return problems


def _each_sample(
    count: int, path: str, show_progress: bool, problems: list[str], check: Callable[[int], list[str]]
) -> list[int]:
    """``check(index)`` for every sample, its problems appended to ``problems`` (up to the cap); the bad indices."""
    bad = []
    with _progress_bar(count, path, show_progress) as bar:
        for index in range(count):
            found = check(index)
            if found:
                bad.append(index)
                problems.extend(found[: max(0, _MAX_PROBLEMS - len(problems))])
            bar.update(1)
    return bad


def _tar_samples(state: PackState) -> Callable[[str], int]:
    from fastloader.formats.tar_shards import load_shard_index
    from fastloader.pack.verify_content import expected_of

    recorded = {shard.name: expected_of(shard) for shard in state.shards}

    def samples(shard: str) -> int:  # rebuilt when the shard changed since it was indexed
        return int(load_shard_index(shard, expected=recorded.get(os.path.basename(shard))).meta["samples"])

    return samples


def _content_check(path: str, state: PackState, members: bool) -> tuple[list[str], list[str]]:
    """(the problems of the files' bytes and class names, the line saying the bytes cannot be checked, if so)."""
    from fastloader.pack.verify_content import classes_problems, content_problems, unhashed_problem

    unhashed = unhashed_problem(path, state)
    bytes_problems = content_problems(path, state, members)
    return bytes_problems + classes_problems(path, state.fingerprint, state.classes), [unhashed] if unhashed else []


def _verify_tar(path: str, show_progress: bool) -> VerifyReport:
    from fastloader.datasets.tar import TarShardSource
    from fastloader.formats.tar_manifest import TarPackState

    state = TarPackState.read_manifest(path)  # FormatError if unfinished, or when its numbers disagree
    expected = state.count
    problems, unchecked = _content_check(path, state, members=True)
    if problems:  # reported before the shards' indexes are read: a reader would refuse a changed shard
        problems += _unrecorded_file_problems(path, state, ".tar")
        return VerifyReport(path, "tar", expected, 0, tuple(unchecked + problems))
    from fastloader.pack.verify_index import index_problems, undigested_problem

    undigested = undigested_problem(path, state)
    unchecked += [undigested] if undigested else []
    problems = index_problems(path, state)
    if problems:  # reported before the indexes are loaded: a reader would rebuild one the manifest does not vouch for
        return VerifyReport(path, "tar", expected, 0, tuple(unchecked + problems))
    problems = unchecked + _manifest_problems(path, state, "index", _tar_samples(state), ".tar")
    if len(problems) > len(unchecked):
        return VerifyReport(path, "tar", expected, 0, tuple(problems))
    try:
        source = TarShardSource(path)
    except FormatError as error:  # a shard that no longer parses (truncated, overwritten)
        return VerifyReport(path, "tar", expected, 0, (*problems, str(error)))
    if len(source) != expected:
        problems.append(f"{path}: {len(source)} samples in the shards, the manifest announces {expected}")
    fields = [name for name in source.field_kinds() if name in state.fields]
    for name in source.field_kinds():
        if name not in state.fields:  # a field named by its extension: no pack wrote it
            problems.append(f"{path}: the shards hold '.{name}' members, which the manifest does not record")
    bad = _each_sample(len(source), path, show_progress, problems, lambda i: _tar_sample_problems(source, i, fields))
    return VerifyReport(path, "tar", expected, len(source), tuple(problems), tuple(bad))


def _tar_sample_problems(source: Any, index: int, fields: list[str]) -> list[str]:
    """Why sample ``index`` is bad: its image unreadable, a field member not of its kind (each named)."""
    from fastloader.errors import MissingField

    found = []
    try:
        if not source.read(index):
            raise FormatError(f"{source.key(index)}: empty image member")
    except (OSError, FormatError) as error:
        found.append(str(error))
    for name in fields:
        try:
            source.read_field(index, name)  # decodes it as its recorded kind
        except MissingField:
            continue  # a sample may lack a field
        except (OSError, FormatError) as error:
            found.append(str(error))
    return found


def _reason(error: BaseException, where: str) -> str:
    """What went wrong, without the row the message may start with (the report names it already)."""
    if isinstance(error, FormatError):
        return str(error).removeprefix(f"{where}: ")
    return f"unreadable ({type(error).__name__}: {error})"


def _parquet_row_problems(source: Any, index: int, kinds: dict[str, str]) -> list[str]:
    """Why row ``index`` is bad: its key, image or label unreadable, a field not of its kind (each named
    ``"<file>#<row> (<key>)"``, as the reader's own errors are)."""
    from fastloader.errors import MissingField
    from fastloader.formats.field_values import check_value

    location, key, found = source.location(index), None, []
    try:
        key = source.key(index)
    except (OSError, ValueError) as error:  # the reader's FormatError; anything else is reported too
        found.append(f"{location}: unreadable key ({_reason(error, location)})")
    where = location if key in (None, location) else f"{location} ({key})"
    try:
        if not source.read(index):
            raise FormatError(f"{where}: empty image")
        source.label(index)
    except (OSError, ValueError) as error:
        found.append(f"{where}: {_reason(error, where)}")
    for name, kind in kinds.items():
        try:
            check_value(kind, source.read_field(index, name), f"{where}: field {name!r}")
        except MissingField:
            continue
        except (OSError, ValueError) as error:
            reason = _reason(error, where)
            found.append(f"{where}: {reason if reason.startswith('field') else f'field {name!r}: {reason}'}")
    return found


def _verify_parquet(path: str, show_progress: bool) -> VerifyReport:
    from fastloader.datasets.parquet import ParquetSource, footer_rows
    from fastloader.formats.parquet_pack import ParquetPackState

    state = ParquetPackState.read_manifest(path)  # FormatError if unfinished, or when its numbers disagree
    expected = state.count
    problems, unchecked = _content_check(path, state, members=False)
    # A file's bytes name no row: the rows are read on (the page checksums and values name them).
    problems = unchecked + problems
    found = _manifest_problems(path, state, "footer", footer_rows, ".parquet")
    if found:
        return VerifyReport(path, "parquet", expected, 0, tuple(problems + found))
    try:
        source = ParquetSource(path, verify_checksums=True)
    except FormatError as error:
        return VerifyReport(path, "parquet", expected, 0, (*problems, str(error)))
    if len(source) != expected:
        problems.append(f"{path}: {len(source)} rows in the files, the manifest announces {expected}")
    if source.field_kinds() != state.fields:
        problems.append(f"{path}: the files hold fields {source.field_kinds()}, the manifest {state.fields}")
    kinds = {name: kind for name, kind in source.field_kinds().items() if state.fields.get(name) == kind}
    bad = _each_sample(len(source), path, show_progress, problems, lambda i: _parquet_row_problems(source, i, kinds))
    return VerifyReport(path, "parquet", expected, len(source), tuple(problems), tuple(bad))


def verify(dst: str | os.PathLike[str], *, progress: bool = False, expect_digest: str | None = None) -> VerifyReport:
    """Check every record of the pack at ``dst`` (LMDB, tar shards or Parquet), or the index of an MXNet ``.rec``;
    see the module docstring.

    ``expect_digest``: the content digest a user pinned (``fastloader.pack.content_digest``): a pack whose
    records differ from it fails, naming the first record that differs where the pack's record digests
    allow. Plain ``verify`` finds corruption; only a pinned digest finds tampering.

    Raises FileNotFoundError when nothing is there and FormatError when ``dst`` is not a finished
    pack (incomplete, written by another tool or by a newer fastloader).
    """
    report = _verify(os.fspath(dst), progress)
    if expect_digest is None:
        return report
    from fastloader.pack.content_digest import digest_problems

    pinned = digest_problems(dst, expect_digest)
    return dataclasses.replace(report, problems=(*report.problems, *pinned)) if pinned else report


def _verify(path: str, progress: bool) -> VerifyReport:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: the path does not exist")
    if os.path.isfile(path) and path.endswith(".rec"):
        from fastloader.pack.verify_recordio import recordio_problems

        checked, problems, bad = recordio_problems(path)
        return VerifyReport(path, "recordio", checked, checked, tuple(problems), tuple(bad))
    if os.path.isfile(path) or os.path.exists(os.path.join(path, "data.mdb")):
        return _verify_lmdb(path, progress)
    from fastloader.formats.parquet_pack import ParquetPackState
    from fastloader.formats.tar_manifest import MANIFEST_NAME, TarPackState

    if TarPackState.found_in(path):
        return _verify_tar(path, progress)
    if ParquetPackState.found_in(path):
        return _verify_parquet(path, progress)
    raise FormatError(
        f"{path}: neither a fastloader LMDB (no data.mdb) nor tar shards (no {MANIFEST_NAME}) nor a Parquet pack"
    )
