"""A response body read within bounds: never more bytes than expected, never past the request's deadline.

The size a reader expects comes from what it already knows (a listing, a HEAD, the range it asked for),
not from the response: a server that lies about an object (listed at 200 bytes, streaming 3 GB) must not
make us hold or write more than the listing promised. So the announced Content-Length is compared with
the expected size before the first byte is read, and the body is read at most one byte past it (the byte
that proves there is more), whatever the server announced.

The client's read timeout bounds each wait for bytes, not a request: a server that sends one byte every
few seconds never trips it. So a request also has a deadline, ``DEFAULT_DEADLINE_S`` plus the time its
bytes take at ``MIN_BYTES_PER_S`` (a large shard is not cut for being large), checked between reads. A
read returns whatever has arrived (urllib3's ``read1``), so a trickle is cut at most one read timeout
after its deadline. A cut is :class:`~fastloader.errors.RequestDeadline`, retried like any timeout (a
download resumes from its last byte), then a :class:`~fastloader.errors.RemoteError` naming the object.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from fastloader.errors import RemoteError, RequestDeadline

CHUNK_BYTES = 1 << 20  # at most this much per read
DEFAULT_DEADLINE_S = 60.0  # a request's deadline, before the time its bytes take
MIN_BYTES_PER_S = 1 << 20  # the slowest transfer a deadline allows for: 1 MiB/s
DEADLINE_ENV = "FASTLOADER_S3_DEADLINE_S"


def deadline_setting(deadline_s: float | None) -> float:
    """``deadline_s``, else ``$FASTLOADER_S3_DEADLINE_S``, else ``DEFAULT_DEADLINE_S`` (must be > 0)."""
    if deadline_s is None:
        text = os.environ.get(DEADLINE_ENV, "")
        try:
            deadline_s = float(text) if text else DEFAULT_DEADLINE_S
        except ValueError:
            raise ValueError(f"{DEADLINE_ENV}={text!r}: expected a number of seconds") from None
    if not deadline_s > 0:
        raise ValueError(f"deadline_s must be > 0 seconds, got {deadline_s}")
    return float(deadline_s)


def deadline_for(deadline_s: float, size: int | None) -> float:
    """The monotonic time by which a request started now for ``size`` bytes must be done."""
    return time.monotonic() + deadline_s + (size or 0) / MIN_BYTES_PER_S


def check_announced(what: str, expected: int, announced: Any) -> None:
    """RemoteError (not retried: the object is what it is) when a response announces more bytes than expected."""
    if announced is not None and int(announced) > expected:
        raise RemoteError(
            f"{what}: the server announces {int(announced)} bytes, {expected} expected (the listing's or the"
            " range's size): refused before reading"
        )


def read_body(what: str, body: Any, expected: int, deadline: float, write: Callable[[bytes], object]) -> int:
    """Read ``body`` (botocore's StreamingBody, or any stream with ``read``), passing each piece to ``write``;
    returns the bytes read. RemoteError as soon as more than ``expected`` arrive (nothing past them is
    written); RequestDeadline when the monotonic clock passes ``deadline``."""
    raw = getattr(body, "_raw_stream", body)  # urllib3's response: its read1 returns what has arrived
    read = getattr(raw, "read1", raw.read)
    received = 0
    while True:
        if time.monotonic() > deadline:
            raise RequestDeadline(
                f"{what}: {received} of {expected} bytes after the request's deadline ({DEADLINE_ENV});"
                " the server sends too slowly"
            )
        chunk = read(min(CHUNK_BYTES, expected + 1 - received))
        if not chunk:
            return received
        received += len(chunk)
        if received > expected:
            raise RemoteError(f"{what}: the server sends more than the {expected} bytes expected: refused")
        write(chunk)
