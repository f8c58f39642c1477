"""The S3 client: boto3, made after fork in each process, with our retry policy and length checks.

Why boto3 (see ``benchmarks/bench_s3.py`` for the measurement against obstore): it reads credentials
and the endpoint from the standard chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``~/.aws/config`` profiles, instance roles), it is the
client users already have configured, and whole-shard reads are bound by the network, not the client.

* botocore's own retries are off (``total_max_attempts=1``): :mod:`fastloader.remote.retry` is the one policy,
  so truncated bodies and reset connections in the middle of a body are retried too, with jitter.
* Every read checks its length: a range gives exactly its bytes, a whole object its listed size (else its
  ContentLength); a download cut short resumes from its last byte. A body is never read past the size
  expected (plus the one byte that shows there is more), and a request has a deadline besides the read
  timeout (see ``fastloader.remote.bounded``): a server that lies about sizes or trickles bytes is an
  error naming the object, not memory, disk or hours spent.
* Reads are pinned to one version of an object: given its ETag (from the listing a dataset indexed),
  every GET carries ``If-Match`` and every response's ETag is checked too (for servers that ignore
  the header; SeaweedFS and AWS answer 412); a download is pinned to the ETag it is given (else the one
  a HEAD finds) for its resumes too, so a cut body is never spliced with another version. A replaced
  or deleted object is an :class:`~fastloader.errors.ObjectChanged` naming it, never bytes of
  another version.
* A client is never shared across a fork (botocore's connection pools are not fork-safe): each process
  makes its own on first use, and a pickled store (a spawned worker) carries only its settings.
* No secret is ever printed: errors name the object and the server's error code, never credentials
  (see :func:`~fastloader.errors.redact`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastloader.errors import ObjectChanged, RemoteError, TruncatedBody
from fastloader.remote.bounded import check_announced, deadline_for, deadline_setting, read_body
from fastloader.remote.retry import RetryPolicy, with_retries
from fastloader.remote.url import S3Url

IN_FLIGHT = 4  # parts of one multipart upload at once
MULTIPART_BYTES = 64 << 20  # uploads larger than this go in parts of this size
MAX_LISTED_KEYS = 20_000_000  # keys one listing may give (about 4 GB of ObjectInfo): S3Store(max_listed_keys=)
MAX_IDLE_PAGES = 100  # listing pages in a row that bring nothing, and say there is more


@dataclass(frozen=True)
class ObjectInfo:
    """An object as a listing or a HEAD shows it: its key, size and ETag (its version's identity)."""

    key: str
    size: int
    etag: str


def _changed(url: S3Url, etag: str, now: str | None, status: int | None) -> ObjectChanged:
    if status == 404:
        what = f"was deleted since this reader indexed it (ETag {etag})"
    else:
        what = f"was replaced since this reader indexed it (ETag {etag}{f', now {now}' if now else ''})"
    return ObjectChanged(
        f"{url}: the object {what}: the dataset changed under the reader; create the dataset again to read"
        " the new version",
        status=status,
    )


def _same(etag: str, other: str | None) -> bool:
    return other is not None and etag.strip('"') == other.strip('"')


def _pinned(url: S3Url, etag: str | None, response: dict[str, Any]) -> None:
    """ObjectChanged when a response is of another version than ``etag`` (a server that ignored If-Match)."""
    if etag is not None and not _same(etag, response.get("ETag")):
        raise _changed(url, etag, response.get("ETag"), response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


class S3Store:
    """An S3-compatible store: ``endpoint_url`` (None: the environment's ``AWS_ENDPOINT_URL``, else AWS).

    ``deadline_s``: each request's deadline before the time its bytes take at the slowest rate allowed
    (None: ``$FASTLOADER_S3_DEADLINE_S``, else 60 s; see ``fastloader.remote.bounded``).
    ``max_listed_keys``: the most keys one listing may give (see :meth:`list`)."""

    def __init__(
        self,
        endpoint_url: str | None = None,
        region: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        pool: int = 16,
        deadline_s: float | None = None,
        max_listed_keys: int = MAX_LISTED_KEYS,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.region = region
        self.retry = retry or RetryPolicy()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.pool = pool
        self.deadline_s = deadline_setting(deadline_s)
        if not isinstance(max_listed_keys, int) or max_listed_keys < 1:
            raise ValueError(f"max_listed_keys must be a positive integer, got {max_listed_keys!r}")
        self.max_listed_keys = max_listed_keys
        self._pid: int | None = None
        self._client: Any = None
        self._rng = random.Random()
        self.requests = 0  # requests made by this process (for "requests per image")

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_pid=None, _client=None, requests=0)
        return state

    @property
    def client(self) -> Any:
        """This process's boto3 client (made on first use after a fork)."""
        pid = os.getpid()
        if self._client is None or self._pid != pid:
            self._client, self._pid = self._make_client(), pid
            self._rng = random.Random()  # forked workers must not share their jitter
        return self._client

    def _make_client(self) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as error:
            raise RuntimeError("s3:// datasets need boto3: pip install fastloader[s3]") from error

        session = boto3.session.Session()
        region = self.region or session.region_name or "us-east-1"  # S3-compatible stores accept any
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},  # ours is the one retry policy
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            max_pool_connections=self.pool,
            # botocore's CRC check of every response body costs several times the CPU of the download
            # itself (measured: 0.23 against 0.04 CPU-s per 64 MB), CPU the decoding workers need; lengths
            # are checked here, and a corrupt image fails its decode (the dataset's error policy).
            response_checksum_validation="when_required",
        )
        return session.client("s3", endpoint_url=self.endpoint_url, region_name=region, config=config)

    def _call(self, what: str, attempt: Callable[[], Any], url: S3Url | None = None, etag: str | None = None) -> Any:
        """``attempt()`` under the retry policy. A read pinned to version ``etag`` of ``url`` that the server
        refuses (412) or no longer finds (404) is ObjectChanged."""

        def counted() -> Any:
            self.requests += 1
            return attempt()

        try:
            return with_retries(what, counted, self.retry, self._rng)
        except ObjectChanged:
            raise
        except RemoteError as error:
            if url is None or etag is None or error.status not in (404, 412):
                raise
            status = error.status
        raise _changed(url, etag, None, status)  # outside the handler: no chained client error

    def get(
        self,
        url: S3Url,
        start: int | None = None,
        end: int | None = None,
        *,
        etag: str | None = None,
        size: int | None = None,
    ) -> bytes:
        """Bytes ``[start, end)`` of an object (the whole object without them), length checked; of version
        ``etag`` only, when given (see the module docstring). ``size``: the whole object's size as listed:
        a body longer than it is refused, never read whole."""
        where = f"{url}" + (f" [{start}:{end}]" if start is not None else "")

        def attempt() -> bytes:
            kwargs: dict[str, Any] = {"Bucket": url.bucket, "Key": url.key}
            expected = size
            if start is not None and end is not None:
                if end <= start:
                    return b""
                kwargs["Range"] = f"bytes={start}-{end - 1}"
                expected = end - start
            if etag is not None:
                kwargs["IfMatch"] = etag
            deadline = deadline_for(self.deadline_s, expected)
            response = self.client.get_object(**kwargs)
            _pinned(url, etag, response)
            announced = response.get("ContentLength")
            if expected is None:  # nothing known but what the server says: still never more than that
                expected = int(announced) if announced is not None else None
            if expected is None:
                raise RemoteError(f"{where}: the server announced no Content-Length and no size was listed")
            check_announced(where, expected, announced)
            parts: list[bytes] = []
            received = read_body(where, response["Body"], expected, deadline, parts.append)
            if received != expected:
                raise TruncatedBody(f"got {received} of {expected} bytes")
            return b"".join(parts)

        return self._call(where, attempt, url, etag)

    def stat(self, url: S3Url) -> ObjectInfo:
        """The object's size and ETag (one HEAD)."""
        head = self._call(str(url), lambda: self.client.head_object(Bucket=url.bucket, Key=url.key))
        return ObjectInfo(url.key, int(head["ContentLength"]), str(head["ETag"]))

    def size(self, url: S3Url) -> int:
        """The object's size in bytes."""
        return self.stat(url).size

    def exists(self, url: S3Url) -> bool:
        try:
            self.stat(url)
        except RemoteError as error:
            if error.status == 404:
                return False
            raise
        return True

    def list(self, prefix: S3Url, *, recursive: bool = True) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix.key + "/"``, in key order; only those directly
        under it (no further ``/``) when not ``recursive``. A listing is bounded: past ``max_listed_keys``
        keys (and common prefixes), or when its pages stop making progress (a continuation token given back,
        a page cut short without one, pages in a row that bring nothing), it is a RemoteError naming the prefix."""
        token: str | None = None
        start = f"{prefix.key}/" if prefix.key else ""
        where = f"{prefix}/ (list)"
        listed = idle_pages = 0
        while True:
            kwargs: dict[str, Any] = {"Bucket": prefix.bucket, "Prefix": start}
            if not recursive:
                kwargs["Delimiter"] = "/"
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(where, partial(self.client.list_objects_v2, **kwargs))
            contents, prefixes = page.get("Contents", []), page.get("CommonPrefixes", [])
            listed += len(contents) + len(prefixes)
            if listed > self.max_listed_keys:
                raise RemoteError(
                    f"{where}: more than {self.max_listed_keys:,} keys (S3Store(max_listed_keys=...)): a listing"
                    " this long is refused rather than held in memory"
                )
            for item in contents:
                yield ObjectInfo(item["Key"], int(item["Size"]), str(item["ETag"]))
            if not page.get("IsTruncated"):
                return
            # Pages that bring keys (or common prefixes, with a delimiter) end at max_listed_keys, so a cycle
            # of tokens needs no memory of them all; S3 itself never sends many empty pages in a row.
            idle_pages = 0 if contents or prefixes else idle_pages + 1
            last, token = token, page.get("NextContinuationToken")
            if not token:
                problem = "a page says there is more but gives no continuation token"
            elif token == last:
                problem = "a page gives back the continuation token it was asked with"
            elif idle_pages > MAX_IDLE_PAGES:
                problem = f"{idle_pages} pages in a row hold no key"
            else:
                continue
            raise RemoteError(f"{where}: the listing does not end: {problem} (after {listed:,} keys)")

    def download(self, url: S3Url, dest: str, size: int | None = None, *, etag: str | None = None) -> int:
        """The whole object into the file ``dest`` (created, or overwritten), streamed in one GET: a cut
        body is resumed from the last byte received (a ranged GET), not fetched again. Every GET is of one
        version: ``etag``, else the one a HEAD finds first. Returns the size.

        One streaming GET per object (about 600 MB/s on loopback, 0.04 CPU-s per 64 MB) costs less CPU
        than parallel ranged GETs, and CPU is what the decoding workers need; the parallelism comes from
        fetching several shards at once (the prefetch and the workers)."""
        if size is None or etag is None:
            info = self.stat(url)
            size = info.size if size is None else size
            etag = etag or info.etag
        pinned = etag
        with open(dest, "wb") as out:
            received = 0

            def attempt() -> None:
                nonlocal received
                out.seek(received)
                out.truncate()
                kwargs: dict[str, Any] = {"Bucket": url.bucket, "Key": url.key, "IfMatch": pinned}
                if received:
                    kwargs["Range"] = f"bytes={received}-"
                deadline = deadline_for(self.deadline_s, size - received)
                response = self.client.get_object(**kwargs)
                _pinned(url, pinned, response)
                where = f"{url}" + (f" [{received}:]" if received else "")
                check_announced(where, size - received, response.get("ContentLength"))

                def write(chunk: bytes) -> None:  # counted as written: a retry resumes after it
                    nonlocal received
                    out.write(chunk)
                    received += len(chunk)

                read_body(where, response["Body"], size - received, deadline, write)
                if received != size:
                    raise TruncatedBody(f"got {received} of {size} bytes")

            self._call(str(url), attempt, url, pinned)
        return size

    def delete(self, url: S3Url) -> None:
        self._call(f"{url} (delete)", lambda: self.client.delete_object(Bucket=url.bucket, Key=url.key))

    def put(self, url: S3Url, data: bytes) -> None:
        """Write a (small) object in one request."""
        self._call(str(url), lambda: self.client.put_object(Bucket=url.bucket, Key=url.key, Body=data))

    def upload(self, path: str, url: S3Url) -> None:
        """Upload a file; multipart above ``MULTIPART_BYTES``. S3 shows the object only once complete."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES, max_concurrency=IN_FLIGHT
        )
        self._call(
            f"{url} (upload of {path})",
            lambda: self.client.upload_file(path, url.bucket, url.key, Config=config),
        )
