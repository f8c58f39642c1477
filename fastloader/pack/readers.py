"""The reader side of ``fastloader pack``: read each source item, prove it decodes, re-encode it.

A pool of reader processes takes ranges of source positions (``_CHUNK`` at a time) and returns
:class:`Prepared` items; :func:`prepared` yields them in source order to the single writer of the
local engine (``fastloader.pack.local``). An item that cannot be read, is empty or does not decode
becomes a skip with its reason: one bad file never aborts a pack of many hours.

Every image is decoded once to prove it whole, with the checks training's decoder makes: plain JPEGs by
the JPEG extension at 1/8 scale (``fastloader.image.decode.check_whole``: every row entropy-decoded, and
libjpeg's warnings of lost data, a truncation closed by an end marker included, are errors, as are the
scan and pixel limits), the rest by PIL (in grayscale at 1/8 scale for other JPEGs). A file that training
would refuse is never packed nor reported good.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, NamedTuple

from fastloader.datasets.base import Source
from fastloader.fields.source import field_kinds, read_fields
from fastloader.image.decode import check_whole
from fastloader.image.pil import open_image, to_rgb
from fastloader.pack.orphans import die_with_parent

DEFAULT_QUALITY = 90
_CHUNK = 32  # positions per reader task: enough to amortise IPC, small enough to keep order cheap


@dataclass(frozen=True)
class ReencodeOptions:
    resize_max_side: int | None = None
    quality: int | None = None


class Prepared(NamedTuple):
    """One source item, ready for the sink; ``data`` is None when it is skipped for ``reason``."""

    position: int
    key: str
    label: int
    data: bytes | None
    reason: str
    bytes_in: int
    fields: dict[str, Any] | None = None  # the item's fields (fastloader.fields), None for a source without
    outside: str | None = None  # the real path it was read from, when outside the source's root (not confined)


def _fit(width: int, height: int, limit: int) -> tuple[int, int]:
    scale = limit / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def reencode(data: bytes, options: ReencodeOptions, key: str = "<bytes>") -> bytes:
    """Check that ``data`` decodes; shrink / re-encode it as ``options`` ask (see the module docstring).
    Errors name ``key``."""
    from PIL import Image

    checked = check_whole(data, key)  # a plain JPEG, by the extension: what training accepts, and nothing else
    image = open_image(data)
    width, height = image.size
    limit = options.resize_max_side
    shrink = limit is not None and max(width, height) > limit
    if not shrink and options.quality is None:
        if checked:
            return data
        image.draft("L", (max(1, width // 8), max(1, height // 8)))  # JPEG only; others decode fully
        image.load()
        return data
    size = _fit(width, height, limit) if shrink and limit is not None else (width, height)
    if shrink:
        # DCT-scale to at least twice the target, then resample: as PIL's thumbnail(reducing_gap=2),
        # indistinguishable from a full decode and several times cheaper.
        image.draft("RGB", (2 * size[0], 2 * size[1]))
    image = to_rgb(image)  # as decode_pil converts at read time
    image.load()
    if image.size != size:
        image = image.resize(size, Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=options.quality or DEFAULT_QUALITY)
    if not shrink and out.tell() >= len(data):
        return data
    return out.getvalue()


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".replace("\n", " ").replace("\t", " ")


def _outside(source: Source, position: int) -> str | None:
    """Where item ``position`` was read from, when a folder's or a list's item lies outside its root: said in
    the summary. A confined source refused it already; the other kinds read only the files SRC names."""
    where = getattr(source, "outside", None)
    if where is None or getattr(source, "confine", False):
        return None
    real: str | None = where(position)
    return real


def prepare_item(
    source: Source, position: int, options: ReencodeOptions, kinds: dict[str, str] | None = None
) -> Prepared:
    """Read, check and re-encode the item at ``position`` (and read its fields of ``kinds``, the
    source's :func:`~fastloader.fields.source.field_kinds`); any failure becomes a skip reason."""
    key = f"#{position}"
    # Errors are caught broadly on purpose: sources and PIL's plugins raise many exception types
    # for bad files, and one bad file must never abort a pack of many hours.
    try:
        key = source.key(position)
        data = source.read(position)
        label = int(source.label(position))
        fields = read_fields(source, position, kinds) if kinds else None
        outside = _outside(source, position)
    except Exception as error:
        return Prepared(position, key, -1, None, f"unreadable: {describe_error(error)}", 0)
    if not data:
        return Prepared(position, key, label, None, "empty: 0 bytes", 0, outside=outside)
    try:
        packed = reencode(data, options, key)
    except Exception as error:
        return Prepared(position, key, label, None, f"undecodable: {describe_error(error)}", len(data), None, outside)
    return Prepared(position, key, label, packed, "", len(data), fields, outside)


# One reader process's source, options and field kinds, set once by the pool initializer.
_worker: tuple[Source, ReencodeOptions, dict[str, str]] | None = None


def _init_worker(source: Source, options: ReencodeOptions, creator: int, start_method: str) -> None:
    global _worker
    die_with_parent(creator, start_method)  # a pack killed by SIGKILL takes its readers with it
    _worker = (source, options, field_kinds(source))
    # Ctrl-C reaches the whole process group: the main process handles it and closes the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _prepare_range(start: int, stop: int) -> list[Prepared]:
    if _worker is None:
        raise RuntimeError("pack reader process used before its initializer ran")
    source, options, kinds = _worker
    return [prepare_item(source, position, options, kinds) for position in range(start, stop)]


@contextlib.contextmanager
def reader_pool(source: Source, options: ReencodeOptions, workers: int) -> Iterator[ProcessPoolExecutor | None]:
    """Reader processes, all started before the caller opens its output (so that none is forked after).

    An executor rather than ``multiprocessing.Pool``: when a reader dies (killed, out of memory, a
    crash in a decoder) Pool waits forever for its lost task; the executor reports it. Each reader dies
    with this process (``fastloader.pack.orphans``): a pack killed by SIGKILL leaves none behind.
    """
    if workers == 0:
        yield None
        return
    context = multiprocessing.get_context()
    initargs = (source, options, os.getpid(), context.get_start_method())
    executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=initargs)
    try:
        executor.submit(os.getpid).result()  # the first task starts every reader
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _results(future: Future[list[Prepared]], low: int) -> list[Prepared]:
    try:
        return future.result()
    except BrokenProcessPool as error:
        raise RuntimeError(
            f"a reader process died (killed, out of memory or crashed in a decoder) while preparing source "
            f"positions {low}..{low + _CHUNK - 1}; run the same command again to resume"
        ) from error


def prepared(
    source: Source, options: ReencodeOptions, pool: ProcessPoolExecutor | None, start: int, workers: int
) -> Iterator[Prepared]:
    """Every item from ``start`` on, prepared by the readers (or here when there are none), in order."""
    total = len(source)
    if pool is None:
        kinds = field_kinds(source)
        for position in range(start, total):
            yield prepare_item(source, position, options, kinds)
        return
    pending: deque[tuple[Future[list[Prepared]], int]] = deque()
    for low in range(start, total, _CHUNK):
        pending.append((pool.submit(_prepare_range, low, min(low + _CHUNK, total)), low))
        if len(pending) >= 2 * workers + 2:
            yield from _results(*pending.popleft())
    while pending:
        yield from _results(*pending.popleft())
