"""The S3 client: boto3, made after fork in each process, with our retry policy and length checks.

Why boto3 (see ``benchmarks/bench_s3.py`` for the measurement against obstore): it reads credentials
and the endpoint from the standard chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``~/.aws/config`` profiles, instance roles), it is the
client users already have configured, and whole-shard reads are bound by the network, not the client.

* botocore's own retries are off (``total_max_attempts=1``): :mod:`fastloader.remote.retry` is the one policy,
  so truncated bodies and reset connections in the middle of a body are retried too, with jitter.
* Every read checks its length: a range gives exactly its bytes, a whole object its ContentLength; a
  download cut short resumes from its last byte.
* A client is never shared across a fork (botocore's connection pools are not fork-safe): each process
  makes its own on first use, and a pickled store (a spawned worker) carries only its settings.
* No secret is ever printed: errors name the object and the server's error code, never credentials.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

from fastloader.remote.retry import RetryPolicy, TruncatedBody, with_retries
from fastloader.remote.url import S3Url

CHUNK_BYTES = 1 << 20  # a download's reads and writes
IN_FLIGHT = 4  # parts of one multipart upload at once
MULTIPART_BYTES = 64 << 20  # uploads larger than this go in parts of this size


class S3Store:
    """An S3-compatible store: ``endpoint_url`` (None: the environment's ``AWS_ENDPOINT_URL``, else AWS)."""

    def __init__(
        self,
        endpoint_url: str | None = None,
        region: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        pool: int = 16,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.region = region
        self.retry = retry or RetryPolicy()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.pool = pool
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

    def _call(self, what: str, attempt: Any) -> Any:
        def counted() -> Any:
            self.requests += 1
            return attempt()

        return with_retries(what, counted, self.retry, self._rng)

    def get(self, url: S3Url, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of an object (the whole object without them), length checked."""

        def attempt() -> bytes:
            kwargs: dict[str, Any] = {"Bucket": url.bucket, "Key": url.key}
            if start is not None and end is not None:
                if end <= start:
                    return b""
                kwargs["Range"] = f"bytes={start}-{end - 1}"
            response = self.client.get_object(**kwargs)
            body = response["Body"].read()
            expected = (end - start) if start is not None and end is not None else response.get("ContentLength")
            if expected is not None and len(body) != expected:
                raise TruncatedBody(f"got {len(body)} of {expected} bytes")
            return body

        where = f"{url}" + (f" [{start}:{end}]" if start is not None else "")
        return self._call(where, attempt)

    def size(self, url: S3Url) -> int:
        """The object's size in bytes."""
        head = self._call(str(url), lambda: self.client.head_object(Bucket=url.bucket, Key=url.key))
        return int(head["ContentLength"])

    def exists(self, url: S3Url) -> bool:
        from fastloader.remote.retry import RemoteError

        try:
            self.size(url)
        except RemoteError as error:
            cause = error.__cause__
            response = getattr(cause, "response", None)
            if isinstance(response, dict) and response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise
        return True

    def list(self, prefix: S3Url) -> Iterator[tuple[str, int]]:
        """``(key, size)`` of every object whose key starts with ``prefix.key + "/"``, in key order."""
        token: str | None = None
        start = f"{prefix.key}/" if prefix.key else ""
        while True:
            kwargs: dict[str, Any] = {"Bucket": prefix.bucket, "Prefix": start}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(f"{prefix}/ (list)", lambda kwargs=kwargs: self.client.list_objects_v2(**kwargs))
            for item in page.get("Contents", []):
                yield item["Key"], int(item["Size"])
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def download(self, url: S3Url, dest: str, size: int | None = None) -> int:
        """The whole object into the file ``dest`` (created, or overwritten), streamed in one GET: a cut
        body is resumed from the last byte received (a ranged GET), not fetched again. Returns the size.

        One streaming GET per object (about 600 MB/s on loopback, 0.04 CPU-s per 64 MB) costs less CPU
        than parallel ranged GETs, and CPU is what the decoding workers need; the parallelism comes from
        fetching several shards at once (the prefetch and the workers)."""
        size = self.size(url) if size is None else size
        with open(dest, "wb") as out:
            received = 0

            def attempt() -> None:
                nonlocal received
                out.seek(received)
                out.truncate()
                kwargs: dict[str, Any] = {"Bucket": url.bucket, "Key": url.key}
                if received:
                    kwargs["Range"] = f"bytes={received}-"
                body = self.client.get_object(**kwargs)["Body"]
                for chunk in body.iter_chunks(CHUNK_BYTES):
                    out.write(chunk)
                    received += len(chunk)
                if received != size:
                    raise TruncatedBody(f"got {received} of {size} bytes")

            self._call(str(url), attempt)
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
