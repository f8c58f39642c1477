"""A loopback HTTP proxy in front of the test S3 server that injects faults: 503 SlowDown, any S3 error,
stalls, truncated bodies and connection resets, on the first N requests matching a method and a key.

    proxy = FaultProxy(s3_server.endpoint_url).start()
    client = s3_server.client(endpoint_url=proxy.url)
    proxy.add(slowdown(method="GET", key="img_0001.jpg", times=2))
    ...
    assert proxy.count("GET", "img_0001.jpg") == 3

The client talks plain HTTP/1.1 to ``proxy.url``; each request's bytes go upstream unchanged, Host header
included. SigV4 signs the Host header the client sent (the proxy's host:port), and SeaweedFS verifies the
signature against the Host header it receives, so it accepts the forwarded requests as they are
(tests/remote/test_s3_server.py checks this). Rewriting Host to the upstream's would break every signature.

One upstream connection per client connection (opened lazily, reopened when the server closes it), so
keep-alive on the client side stays keep-alive. Request bodies (Content-Length or chunked) are read whole
before a request goes upstream; responses are streamed. ``Expect: 100-continue`` (botocore sends it on PUT
and UploadPart) is answered by the proxy itself so the client sends its body at once; the server's own
interim 100 is dropped.

Standard library only; a thread per client connection. Nothing runs on import.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

MAX_HEAD = 64 * 1024
PIECE = 64 * 1024
UPSTREAM_TIMEOUT_S = 60.0

SLOWDOWN_MESSAGE = "Please reduce your request rate."
MESSAGES = {
    "SlowDown": SLOWDOWN_MESSAGE,
    "InternalError": "We encountered an internal error. Please try again.",
    "ServiceUnavailable": "Service is unable to handle request.",
    "NoSuchKey": "The specified key does not exist.",
    "AccessDenied": "Access Denied",
}
REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass
class Rule:
    """A fault for the first ``times`` requests whose method is ``method`` (None: any) and whose unquoted
    request target (``/bucket/key?query``) contains ``key`` ("" matches all). ``times=None``: every match.

    Build one with slowdown(), error(), stall(), truncate() or reset().
    """

    action: str  # "error" (slowdown is an error), "stall", "truncate", "reset"
    method: str | None = None
    key: str = ""
    times: int | None = 1
    status: int = 503
    code: str = "SlowDown"
    message: str = SLOWDOWN_MESSAGE
    seconds: float = 0.0
    nbytes: int = 0
    hits: int = 0  # requests this rule has acted on

    def matches(self, method: str, target: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return (self.method is None or self.method.upper() == method) and self.key in target

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


def slowdown(*, method: str | None = None, key: str = "", times: int | None = 1) -> Rule:
    """503 SlowDown with AWS's XML error body and, like AWS, no Retry-After."""
    return Rule("error", method, key, times, status=503, code="SlowDown", message=SLOWDOWN_MESSAGE)


def error(
    status: int,
    code: str,
    *,
    message: str | None = None,
    method: str | None = None,
    key: str = "",
    times: int | None = 1,
) -> Rule:
    """Any status with an S3 XML error body, e.g. error(500, "InternalError"), error(404, "NoSuchKey")."""
    text = message if message is not None else MESSAGES.get(code, code)
    return Rule("error", method, key, times, status=status, code=code, message=text)


def stall(seconds: float, *, method: str | None = None, key: str = "", times: int | None = 1) -> Rule:
    """Read the request, send nothing for ``seconds``, then close: the client's read timeout fires first."""
    return Rule("stall", method, key, times, seconds=seconds)


def truncate(nbytes: int, *, method: str | None = None, key: str = "", times: int | None = 1) -> Rule:
    """Forward the real status and headers (real Content-Length) but only ``nbytes`` of the body, then close."""
    return Rule("truncate", method, key, times, nbytes=nbytes)


def reset(*, method: str | None = None, key: str = "", times: int | None = 1) -> Rule:
    """Close the client connection with a TCP RST (SO_LINGER 0) instead of answering."""
    return Rule("reset", method, key, times)


@dataclass(frozen=True)
class Request:
    """One request the proxy received: ``target`` is the unquoted ``/bucket/key?query``; ``fault`` the rule
    action applied to it, or None when it was forwarded untouched."""

    method: str
    target: str
    fault: str | None


class _Closed(Exception):
    """The peer closed the connection (cleanly, between requests, or in the middle of one)."""


def _read_head(reader: BinaryIO) -> bytes:
    """The bytes of a request or response head up to and including the blank line; _Closed on EOF before it."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = reader.readline(MAX_HEAD + 1)
        if not line:
            raise _Closed("EOF" if not lines else "EOF inside a head")
        if not lines and line in (b"\r\n", b"\n"):
            continue  # RFC 9112: a server ignores blank lines before a request line
        lines.append(line)
        size += len(line)
        if size > MAX_HEAD:
            raise ValueError("HTTP head over 64 KiB")
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    """(first line, lowercased header names -> values) of a head."""
    text = head.decode("latin-1")
    first, _, rest = text.partition("\r\n")
    headers: dict[str, str] = {}
    for line in rest.split("\r\n"):
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return first, headers


def _read_exact(reader: BinaryIO, n: int) -> bytes:
    data = reader.read(n)
    if len(data) < n:
        raise _Closed(f"EOF after {len(data)} of {n} body bytes")
    return data


def _body_pieces(reader: BinaryIO, headers: dict[str, str], has_body: bool, to_eof: bool) -> Iterator[bytes]:
    """The raw body bytes as they are on the wire (chunk framing included), in pieces; nothing if no body.

    With neither Content-Length nor chunked encoding, a body runs to EOF if ``to_eof`` (a response's),
    else it is empty (a request's, RFC 9112 6.3).
    """
    if not has_body:
        return
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = reader.readline(MAX_HEAD)
            if not size_line:
                raise _Closed("EOF in a chunk size line")
            yield size_line
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    line = reader.readline(MAX_HEAD)
                    if not line:
                        raise _Closed("EOF in chunked trailers")
                    yield line
                    if line in (b"\r\n", b"\n"):
                        return
            remaining = size + 2  # the data and its CRLF
            while remaining:
                piece = _read_exact(reader, min(remaining, PIECE))
                remaining -= len(piece)
                yield piece
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining:
            piece = _read_exact(reader, min(remaining, PIECE))
            remaining -= len(piece)
            yield piece
    elif to_eof:
        while True:
            piece = reader.read1(PIECE)  # type: ignore[attr-defined]
            if not piece:
                return
            yield piece


def _wants_close(first_line: str, headers: dict[str, str]) -> bool:
    connection = headers.get("connection", "").lower()
    return "close" in connection or first_line.upper().startswith("HTTP/1.0") or first_line.endswith("HTTP/1.0")


def _error_response(rule: Rule, method: str, target: str) -> bytes:
    request_id = uuid.uuid4().hex[:16].upper()
    resource = target.split("?", 1)[0]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{rule.code}</Code><Message>{rule.message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId>"
        f"<HostId>fault-proxy</HostId></Error>"
    ).encode()
    reason = REASONS.get(rule.status, "Error")
    head = (
        f"HTTP/1.1 {rule.status} {reason}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        "Server: fault-proxy\r\n"
        "\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


class _Upstream:
    """The proxy's connection to the server for one client connection."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self.sock: socket.socket | None = None
        self.reader: BinaryIO | None = None

    def connect(self) -> None:
        self.close()
        self.sock = socket.create_connection(self.address, timeout=UPSTREAM_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def close(self) -> None:
        if self.reader is not None:
            with contextlib.suppress(OSError):
                self.reader.close()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None
        self.reader = None

    def send_and_read_head(self, request: bytes) -> tuple[bytes, str, dict[str, str]]:
        """Send a whole request and read the final response head (interim 1xx dropped).

        A kept-alive connection the server has meanwhile closed fails at once with nothing received: the
        request then goes again, once, on a new connection.
        """
        fresh = self.sock is None
        for attempt in range(2):
            if self.sock is None:
                self.connect()
                fresh = True
            assert self.sock is not None and self.reader is not None
            try:
                self.sock.sendall(request)
                while True:
                    head = _read_head(self.reader)
                    first, headers = _headers(head)
                    status = int(first.split()[1])
                    if not 100 <= status < 200:
                        return head, first, headers
            except (_Closed, ConnectionError) as e:
                self.close()
                if fresh or attempt == 1:
                    raise _Closed(f"upstream closed the connection: {e}") from e
        raise AssertionError("unreachable")


class FaultProxy:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"FaultProxy forwards plain http only, not {upstream_url!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._requests: list[Request] = []
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._accepted = 0
        self.url = ""

    # -- what tests use ------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(0.1)  # the accept loop checks for stop() this often
        self._listener = listener
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        self._accept_thread = threading.Thread(target=self._accept_loop, name="fault-proxy-accept", daemon=True)
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, cut every open connection and wait for the threads; idempotent."""
        self._stopping.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
            threads = list(self._threads)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=5)

    def add(self, rule: Rule) -> Rule:
        """Append a rule (rules are tried in order; the first live match acts). Returns it, to read ``hits``."""
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule (the request log stays; see reset_requests)."""
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)

    @property
    def requests(self) -> list[Request]:
        """A copy of every request received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def count(self, method: str | None = None, key: str = "", *, fault: str | None | bool = False) -> int:
        """Requests received with this method (None: any) whose target contains ``key``; faulted or not.

        ``fault``: False counts all, None only forwarded ones, a name ("error", "stall", ...) only those.
        """
        with self._lock:
            return sum(
                1
                for r in self._requests
                if (method is None or r.method == method.upper())
                and key in r.target
                and (fault is False or r.fault == fault)
            )

    def reset_requests(self) -> None:
        """Forget the requests received so far (and the connection count)."""
        with self._lock:
            self._requests.clear()
            self._accepted = 0

    @property
    def connections(self) -> int:
        """Client connections accepted so far: with keep-alive, fewer than requests."""
        with self._lock:
            return self._accepted

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the proxy -----------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            thread = threading.Thread(target=self._serve, args=(conn,), name="fault-proxy-conn", daemon=True)
            with self._lock:
                self._accepted += 1
                self._conns.add(conn)
                self._threads.add(thread)
            thread.start()

    def _match(self, method: str, target: str) -> Rule | None:
        with self._lock:
            rule = next((r for r in self._rules if r.matches(method, target)), None)
            if rule is not None:
                rule.hits += 1
            self._requests.append(Request(method, target, rule.action if rule else None))
            return rule

    def _serve(self, conn: socket.socket) -> None:
        upstream = _Upstream(*self.upstream)
        reader = conn.makefile("rb")
        try:
            while not self._stopping.is_set():
                if not self._one_exchange(conn, reader, upstream):
                    break
        except (_Closed, OSError, ValueError):
            pass  # the client or the server went away, or stop() cut the connection
        finally:
            upstream.close()
            with contextlib.suppress(OSError):
                reader.close()
            with contextlib.suppress(OSError):
                conn.close()
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())

    def _one_exchange(self, conn: socket.socket, reader: BinaryIO, upstream: _Upstream) -> bool:
        """Serve one request on a client connection; False when the connection is to be closed."""
        head = _read_head(reader)
        first, headers = _headers(head)
        method, raw_target, _version = first.split(" ", 2)
        target = unquote(raw_target)
        if "100-continue" in headers.get("expect", "").lower():
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b"".join(_body_pieces(reader, headers, has_body=True, to_eof=False))
        client_close = _wants_close(first, headers)
        rule = self._match(method, target)

        if rule is not None and rule.action == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False  # _serve closes it: with linger 0 that sends RST
        if rule is not None and rule.action == "stall":
            self._stopping.wait(rule.seconds)
            return False
        if rule is not None and rule.action == "error":
            conn.sendall(_error_response(rule, method, target))
            return not client_close

        response_head, status_line, response_headers = upstream.send_and_read_head(head + body)
        status = int(status_line.split()[1])
        has_body = method != "HEAD" and status not in (204, 304)
        conn.sendall(response_head)
        budget = rule.nbytes if rule is not None and rule.action == "truncate" else None
        for piece in _body_pieces(upstream.reader, response_headers, has_body, to_eof=True):  # type: ignore[arg-type]
            if budget is not None:
                piece = piece[:budget]
                budget -= len(piece)
            if piece:
                conn.sendall(piece)
            if budget == 0:
                break
        if budget is not None:
            upstream.close()  # the rest of that response is still on the wire: the connection is unusable
            return False
        delimited = has_body and "content-length" not in response_headers
        chunked = "chunked" in response_headers.get("transfer-encoding", "").lower()
        if _wants_close(status_line, response_headers) or (delimited and not chunked):
            upstream.close()
            return False
        return not client_close
