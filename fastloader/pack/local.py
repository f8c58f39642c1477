"""The local pack engine: reader processes on this machine, one writer, a sink that owns durability.

Data flow: a pool of ``workers`` reader processes (default: the usable cores) takes ranges of
source positions, reads each item, checks that it decodes and re-encodes it when asked
(``fastloader.pack.readers``). This process is the one writer: it takes the results in source order
and hands them to the sink (``LMDBSink``, ``TarShardSink`` or ``ParquetSink``), which batches commits
and owns durability. At most ``2 * workers + 2`` ranges are in flight, so memory stays bounded when the
writer is the slow side. The pool is forked before the sink opens its output (an LMDB environment must
never cross a fork).

Resume: the options and digests of the source (its kind, count, and every item's identity: see
``fastloader.pack.source_items``) form the pack's fingerprint. Run again with the same arguments
after a kill (even SIGKILL), a pack continues from the sink's ``resume_position()``: 0 samples lost,
0 duplicated. A destination holding a pack with another fingerprint is a clear error, never a silent
mix; an item changed since the pack began is named.

The Ray engine (``fastloader.pack.ray_engine``) runs this module's per-item code (:func:`hand_over`)
and sinks in its tasks; a pack to S3 (``fastloader.pack.remote``) runs :func:`pack_local` into a
staging directory, then uploads it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastloader.datasets.base import Source
from fastloader.datasets.sources import open_source
from fastloader.fields.source import field_kinds
from fastloader.pack.lmdb_sink import DEFAULT_COMMIT_EVERY, DEFAULT_MAP_SIZE, LMDBSink
from fastloader.pack.readers import Prepared, ReencodeOptions, describe_error, prepared, reader_pool
from fastloader.pack.sink import Sink
from fastloader.pack.source_items import check_unchanged, identity, item_digests, record
from fastloader.pack.summary import PackSummary, report_path, write_report
from fastloader.world import usable_cpus

OUTPUT_FORMATS = ("lmdb", "tar", "parquet")


@dataclass
class Counts:
    packed: int = 0
    skipped: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    outside: int = 0  # items read from outside the source's root (a link, ../, an absolute path)
    outside_example: str | None = None


def hand_over(sink: Sink, item: Prepared, counts: Counts) -> None:
    """Add a prepared item to the sink, or record why it is skipped."""
    reason = item.reason
    if item.outside is not None:  # read, whether or not it decodes: the user is told it happened
        counts.outside += 1
        counts.outside_example = counts.outside_example or f"{item.key} -> {item.outside}"
    if item.data is not None:
        try:
            sink.add(item.position, item.key, item.label, item.data, item.fields)
        except ValueError as error:  # an output that cannot hold this image (tar: an unknown format)
            reason = f"rejected: {describe_error(error)}"
        else:
            counts.packed += 1
            counts.bytes_in += item.bytes_in
            counts.bytes_out += len(item.data)
            return
    sink.add_skipped(item.position, item.key, reason)
    counts.skipped += 1


def _copy(items: Iterator[Prepared], sink: Sink, total: int, start: int, dst: str, progress: bool) -> Counts:
    from tqdm import tqdm

    counts = Counts()
    name = os.path.basename(dst.rstrip(os.sep))
    bar = tqdm(total=total, initial=start, unit="img", desc=f"pack {name}", disable=not progress, file=sys.stderr)
    with bar:
        for item in items:
            hand_over(sink, item, counts)
            if item.data is None:
                bar.set_postfix(skipped=counts.skipped, refresh=False)
            bar.update(1)
    return counts


def pack_fingerprint(
    source: Source,
    kind: str,
    output: str,
    options: ReencodeOptions,
    shard_size: int,
    fields: dict[str, str],
    digests: np.ndarray | None = None,
) -> dict[str, Any]:
    digests = item_digests(source) if digests is None else digests
    fingerprint: dict[str, Any] = {
        "source": {"kind": kind, "count": len(source), **identity(source, digests)},
        "output": output,
        "resize_max_side": options.resize_max_side,
        "quality": options.quality,
    }
    if output in ("tar", "parquet"):
        fingerprint["shard_size"] = shard_size
    if getattr(source, "confine", False):  # only when set: the fingerprints of earlier packs stay as they were
        fingerprint["confine"] = True
    if fields:
        fingerprint["fields"] = fields
    return fingerprint


def _open_sink(
    dst: str,
    output: str,
    fingerprint: dict[str, Any],
    shard_size: int,
    commit_every: int,
    map_size: int,
    fields: dict[str, str],
) -> Sink:
    if output == "lmdb":
        return LMDBSink(dst, fingerprint, map_size=map_size, commit_every=commit_every, fields=fields)
    sink: Sink
    if output == "parquet":
        from fastloader.pack.parquet_sink import ParquetSink

        sink = ParquetSink(dst, fingerprint, shard_size=shard_size, fields=fields)
        return sink
    from fastloader.pack.tar_sink import TarShardSink

    sink = TarShardSink(dst, fingerprint, shard_size=shard_size, fields=fields)
    return sink


def _abandon(sink: Sink) -> None:
    """Keep what an interrupted pack handed over, if the sink still can, and close it.

    A sink whose write failed refuses the checkpoint (it is poisoned: see ``fastloader.pack.sink``), so
    what it recorded stays its last durable state; the same command run again resumes from there.
    """
    # Already on an error path (a full disk fails these too): the first error is the one to report.
    with contextlib.suppress(Exception):
        sink.checkpoint()
    with contextlib.suppress(Exception):
        sink.close()


def _raise_write_error(error: BaseException, dst: str) -> None:
    """Name the destination and the remedy when writing failed (a full disk, an unwritable path):
    LMDB says only "Input/output error", and OSError does not always name the file."""
    import lmdb

    if isinstance(error, (OSError, lmdb.Error)) and not isinstance(error, FileNotFoundError):
        raise OSError(
            getattr(error, "errno", None) or 0,
            f"{dst}: writing the pack failed ({type(error).__name__}: {error}). Is the disk full or the"
            " destination unwritable? What was committed is kept, and it is not a complete pack: free"
            " space and run the same command again to resume.",
        ) from error


def check_options(output: str, resize_max_side: int | None, quality: int | None, workers: int | None) -> None:
    if output not in OUTPUT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(OUTPUT_FORMATS)}, got {output!r}")
    if resize_max_side is not None and (not isinstance(resize_max_side, int) or resize_max_side < 1):
        raise ValueError(f"resize_max_side must be a positive integer or None, got {resize_max_side!r}")
    if quality is not None and (not isinstance(quality, int) or not 1 <= quality <= 100):
        raise ValueError(f"quality must be an integer from 1 to 100 or None, got {quality!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 0):
        raise ValueError(f"workers must be a non-negative integer or None, got {workers!r}")


def pack_local(
    src: str | os.PathLike[str] | Source,
    dst: str,
    *,
    format: str | None = None,
    resize_max_side: int | None = None,
    quality: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    src_format: str = "auto",
    root: str | None = None,
    confine: bool = False,
    shard_size: int = 10000,
    commit_every: int = DEFAULT_COMMIT_EVERY,
    map_size: int = DEFAULT_MAP_SIZE,
) -> PackSummary:
    """Pack ``src`` into the local ``dst`` on this machine (the arguments of :func:`fastloader.pack.engine.pack`)."""
    format = format or "lmdb"
    check_options(format, resize_max_side, quality, workers)
    options = ReencodeOptions(resize_max_side, quality)
    if isinstance(src, Source):
        source, kind, src_name = src, type(src).__name__, type(src).__name__
    else:
        src_name = os.fspath(src)
        source, kind = open_source(src_name, src_format, root=root, confine=confine)
    workers = usable_cpus() if workers is None else workers  # affinity and cgroup quota
    fields = field_kinds(source)
    digests = item_digests(source)
    fingerprint = pack_fingerprint(source, kind, format, options, shard_size, fields, digests)
    check_unchanged(dst, source, digests)  # names the first changed item, before the sink's "another pack"
    started = time.monotonic()
    with reader_pool(source, options, workers) as pool:
        sink = _open_sink(dst, format, fingerprint, shard_size, commit_every, map_size, fields)
        try:
            record(dst, digests)
            start = sink.resume_position()
            items = prepared(source, options, pool, start, workers)
            counts = _copy(items, sink, len(source), start, dst, progress)
            skipped = sink.skipped()
            classes = getattr(source, "classes", None)
            sink.finish(None if classes is None else list(classes), {"source": src_name, "source_kind": kind})
        except BaseException as error:
            _abandon(sink)
            _raise_write_error(error, dst)
            raise
    report = None
    if skipped:
        report = report_path(dst)
        write_report(report, skipped)
    return PackSummary(
        src_name,
        dst,
        format,
        total=len(source),
        resumed_from=start,
        packed_now=counts.packed,
        skipped=tuple(skipped),
        bytes_in=counts.bytes_in,
        bytes_out=counts.bytes_out,
        elapsed_s=time.monotonic() - started,
        report_path=report,
        outside=counts.outside,
        outside_example=counts.outside_example,
    )
