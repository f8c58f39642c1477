"""A tiny S3 endpoint on loopback that misbehaves on purpose: it answers every GET of ``/bucket/key`` with
one object body, sent as a test says (a Content-Length that lies, more bytes than announced, a trickle).

Only the GET path of :class:`~fastloader.remote.s3.S3Store` is exercised (``get``, and ``download`` given
the size and ETag a listing would give): botocore speaks plain HTTP to a loopback endpoint, path-style,
and reads an object's body as it comes, so no S3 XML is needed. Signatures are not checked. A listing
(``GET /bucket?list-type=2``) is answered by ``listing``, a test's function of the continuation token
asked with (None for the first page) giving a page made by :func:`list_page`.

``FakeS3(...).start()`` serves in a thread; ``stop()`` ends it and every connection's sending (each
handler checks the stop flag between writes and gives up when the client went away). Nothing runs on import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

ETAG = '"0123456789abcdef0123456789abcdef"'


@dataclass
class FakeS3:
    """``announce``: the Content-Length sent (None: none, the body ends when the connection closes);
    ``send``: the bytes actually sent at most; ``piece`` bytes per write, ``pause_s`` between writes."""

    announce: int | None
    send: int
    piece: int = 64 * 1024
    pause_s: float = 0.0
    listing: Callable[[str | None], bytes] | None = None
    sent: int = 0  # bytes written to clients, all requests together
    requests: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeS3:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                fake._serve(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-s3", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests += 1
        query = parse_qs(urlsplit(handler.path).query)
        if "list-type" in query and self.listing is not None:
            page = self.listing(query.get("continuation-token", [None])[0])
            handler.send_response(200)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(page)))
            handler.end_headers()
            handler.wfile.write(page)
            return
        # A resumed download asks for ``bytes=N-``: the rest of what it would have sent, as S3 answers (206).
        skip = int(handler.headers.get("Range", "bytes=0-")[len("bytes=") :].split("-")[0])
        handler.send_response(206 if skip else 200)
        handler.send_header("ETag", ETAG)
        handler.send_header("Content-Type", "application/octet-stream")
        if self.announce is None:
            handler.send_header("Connection", "close")  # the body ends with the connection
            handler.close_connection = True
        else:
            handler.send_header("Content-Length", str(self.announce - skip))
        handler.end_headers()
        left, zeros = self.send - skip, bytes(self.piece)
        try:
            while left > 0 and not self._stop.is_set():
                piece = zeros[: min(self.piece, left)]
                handler.wfile.write(piece)
                handler.wfile.flush()
                left -= len(piece)
                with self._lock:
                    self.sent += len(piece)
                if self.pause_s:
                    self._stop.wait(self.pause_s)
        except OSError:  # the client went away (what a bounded reader does)
            pass
        handler.close_connection = True


def list_page(keys: list[str], next_token: str | None, size: int = 1) -> bytes:
    """A ListObjectsV2 page holding ``keys`` (``size`` bytes each), which says there is more when ``next_token``."""
    contents = "".join(
        f"<Contents><Key>{escape(key)}</Key><Size>{size}</Size><ETag>{escape(ETAG)}</ETag></Contents>" for key in keys
    )
    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{next_token}</NextContinuationToken>"
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name>'
        f"<KeyCount>{len(keys)}</KeyCount>{contents}"
        + (more if next_token else "<IsTruncated>false</IsTruncated>")
        + "</ListBucketResult>"
    ).encode()


def wait_quiet(fake: FakeS3, timeout_s: float = 5.0) -> None:
    """Until the fake's sending stops growing (its handlers saw the client go), at most ``timeout_s``."""
    end, last = time.monotonic() + timeout_s, -1
    while time.monotonic() < end and fake.sent != last:
        last = fake.sent
        time.sleep(0.2)
