"""The exceptions fastloader raises for bad data: each names the file, key or record at fault."""

from __future__ import annotations


class FastloaderError(Exception):
    """Base class of fastloader's own errors."""


class FormatError(FastloaderError, ValueError):
    """A file is not in the expected format (bad magic, bad length, bad checksum, unknown version)."""


class DecodeError(FastloaderError, ValueError):
    """An image's bytes cannot be decoded."""


class TooManyBadSamples(FastloaderError, RuntimeError):
    """More bad samples than a dataset's error policy allows (``max_errors``)."""
