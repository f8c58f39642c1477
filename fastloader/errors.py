"""Every exception fastloader raises of its own, in one place: ``from fastloader.errors import X``.

Each names the file, key, record or object at fault. All derive from :class:`FastloaderError` and from
the built-in exception a caller would catch without knowing fastloader (``ValueError`` for bad data,
``OSError`` for storage, ...):

* bad data: :class:`FormatError` (a file not in its format), :class:`MissingField` (a sample without
  the field asked for), :class:`DecodeError` (an image that does not decode), :class:`TooManyBadSamples`
  (more bad samples than the error policy allows);
* the JPEG region decoder (``fastloader.image.jpeg_ext``): :class:`UnsupportedJPEGError` and
  :class:`CorruptJPEGError`, which the image path leaves to PIL;
* object storage (``fastloader.remote``): :class:`RemoteError` (a request that failed for good),
  :class:`ObjectChanged` (an object replaced after it was indexed), :class:`TruncatedBody` (a short
  body, retried), :class:`RequestDeadline` (a request past its deadline, retried), :class:`CacheStuck`
  (a wait in the shard cache that saw no progress);
* images a dataset names by path (a Hugging Face ``Image`` stored as ``{bytes: null, path}`` in Parquet):
  :class:`ImagePathError`; a sample leading outside its folder's or list's root under ``confine=True``:
  :class:`OutsideRoot`;
* the pack tool: :class:`DestinationLocked` (another ``fastloader pack`` writes into that destination);
* GPU decode: :class:`JpegDecoderUnavailable` (no JPEG decoder works on the device);
* Ray actors (``worker_method="ray"``): :class:`WorkersLost` (the cluster cannot go on) and
  :class:`BatchKillsWorkers` (one batch killed the actors making it).
* the loader: :class:`PipelineLost` (the process of a ``worker_method="subprocess"`` loader died).

No secret reaches a message of a :class:`RemoteError`: its text goes through :func:`redact`.
"""

from __future__ import annotations

import os
import re


class FastloaderError(Exception):
    """Base class of fastloader's own errors."""


class FormatError(FastloaderError, ValueError):
    """A file is not in the expected format (bad magic, bad length, bad checksum, unknown version)."""


class MissingField(FormatError):
    """An item has no field of the name asked for (the message names the item's key and the field)."""


class DecodeError(FastloaderError, ValueError):
    """An image's bytes cannot be decoded."""


class TooManyBadSamples(FastloaderError, RuntimeError):
    """More bad samples than a dataset's error policy allows (``max_errors``)."""


class ImagePathError(FastloaderError, OSError):
    """An image a row names by path cannot be read (missing, not a regular file, not readable, not a local
    path): the message names the row (its file and position) and the path, as stored and as looked for."""


class OutsideRoot(FastloaderError, PermissionError):
    """A sample whose real path (its symbolic links resolved) lies outside its source's root, read under
    ``confine=True``: the message names the sample's key, the root and where the key points."""


class DestinationLocked(FastloaderError, RuntimeError):
    """Another ``fastloader pack`` holds the destination's lock (the message names its pid, host and start)."""


class JpegDecoderUnavailable(FastloaderError, RuntimeError):
    """``decode_on="cuda"`` found no JPEG decoder that works here: torchcodec and torchvision each not
    installed or failing a probe decode (the message says why for each)."""


class UnsupportedJPEGError(FastloaderError, NotImplementedError):
    """A valid JPEG that the region decoder does not handle (CMYK, YCCK, 12-bit, ...): decode it with PIL."""


class CorruptJPEGError(FastloaderError, ValueError):
    """libjpeg-turbo found the data corrupt (truncated, bad markers): PIL decodes it or names the fault."""


# ``scheme://user:password@host``: everything between the scheme and the last ``@`` of the authority goes
# (a password may hold an unescaped ``@``).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s\"']*@")
# Query-string credentials: presigned S3 URLs, SAS-style tokens, passwords.
_QUERY_SECRET = re.compile(
    r"(?i)((?:x-amz-(?:signature|credential|security-token)|awsaccesskeyid|signature|sig|token|password|secret)=)"
    r"[^&\s\"']*"
)
# Secrets of the standard credential chain, removed wherever they appear (no client prints them; belt and braces).
_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def redact(text: str) -> str:
    """``text`` without URL userinfo, query-string credentials or the environment's secret key and session
    token (each replaced by ``***``)."""
    text = _QUERY_SECRET.sub(r"\1***", _USERINFO.sub(r"\1***@", text))
    for name in _SECRET_VARS:
        value = os.environ.get(name, "")
        if len(value) >= 8:  # a short value would blank out ordinary words
            text = text.replace(value, "***")
    return text


# What a terminal or a log reader acts on rather than shows: C0 controls (ESC starts the sequences that
# clear a screen or, by OSC 52, write the clipboard; BEL ends them; a newline forges a log line), DEL,
# C1 controls (U+009B is a one-character CSI), the Unicode line and paragraph separators, and the
# bidirectional overrides and isolates (they reorder what a reader sees).
CONTROL_CHARACTERS = "\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def printable(text: str) -> str:
    """``text`` as it may be printed or logged when it comes from data (a file name, a tar member, a
    key): the file-name bytes that are not UTF-8 (the lone surrogates ``surrogateescape`` makes of them)
    written as ``\\xNN`` escapes, other lone surrogates as ``\\uNNNN``, and every control character
    (``CONTROL_CHARACTERS``) as ``\\t``, ``\\n``, ``\\r``, ``\\xNN`` or ``\\uNNNN``: one line, shown
    as written, that no terminal acts on. The one function for every name fastloader prints or logs."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate surrogateescape does not make
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(_escaped, text)


class RemoteError(FastloaderError, OSError):
    """A remote read or write that failed for good; the message names the object.

    ``status`` / ``code``: the server's HTTP status and S3 error code when it answered (else None).
    """

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(redact(message))
        self.status, self.code = status, code


class ObjectChanged(RemoteError):
    """An object read through an index is no longer the version that was indexed (replaced or deleted)."""


class TruncatedBody(FastloaderError, OSError):
    """A response body shorter (or longer) than the length the request asked for."""


class RequestDeadline(FastloaderError, TimeoutError):
    """A remote request still unfinished at its deadline (a server trickling bytes); retried like a timeout."""


class PipelineLost(FastloaderError, RuntimeError):
    """The process of a ``worker_method="subprocess"`` loader died (killed, crashed): the message names the mode,
    its pid and how it ended. Its batches in flight are lost; the loader's state is still where the training
    loop was (``state_dict()`` resumes from there)."""


class CacheStuck(FastloaderError, TimeoutError):
    """A wait in the shard cache saw no progress for ``wait_s`` seconds; the message names the object."""


class BatchKillsWorkers(FastloaderError, RuntimeError):
    """One batch was being made by each of several workers when they died (``worker_method="ray"``): the
    message names the batch (its epoch, its place in the order, its sample indices)."""


class WorkersLost(FastloaderError, RuntimeError):
    """Remote workers (``worker_method="ray"``) can make no progress: every actor died and the replacements
    allowed are spent, or none could be placed on the cluster before the deadline. The message says which and
    the last actor's error."""
