"""Map the pages of a buffer in one system call instead of one page fault per 4 KiB (Linux 5.14+, best effort).

A batch buffer is 38 MB at 256 x 224² x 3: touching it page by page costs 70-90 µs per 224² image
(measured, 2-core VM), as much as a small JPEG's resize. ``madvise(MADV_POPULATE_WRITE)`` maps a fresh
buffer's pages in one call (10-25% less for allocating and filling one, measured in isolation), and
``MADV_POPULATE_READ`` maps pages another process wrote (a batch ring's slot, the first time this process
reads it). Older kernels refuse both (EINVAL): they are asked once, then the pages fault in as before.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from collections.abc import Callable

POPULATE_READ = 22  # MADV_POPULATE_READ, Linux 5.14+
POPULATE_WRITE = 23  # MADV_POPULATE_WRITE


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` on Linux, else None (looked up once)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_refused: set[int] = set()  # the advice this kernel refused: not asked again


def populate(address: int, length: int, advice: int = POPULATE_WRITE) -> None:
    """Map the pages of ``[address, address + length)`` now (``advice``: POPULATE_WRITE or POPULATE_READ)."""
    madvise = _madvise() if advice not in _refused else None
    if madvise is None or length <= 0:
        return
    start = address - address % mmap.PAGESIZE
    if madvise(start, address + length - start, advice) != 0:
        _refused.add(advice)  # not supported here
