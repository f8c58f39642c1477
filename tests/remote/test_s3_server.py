"""The remote-storage test infrastructure itself: the SeaweedFS server checks signatures and serves ranges,
the fault proxy forwards S3 traffic unchanged, and each fault rule does what it says to a bare boto3 client."""

from __future__ import annotations

import http.client
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("boto3")

from boto3.s3.transfer import TransferConfig  # noqa: E402
from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402
from botocore.exceptions import (  # noqa: E402
    ClientError,
    ConnectionClosedError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)

import tests.remote.s3_server as s3_server_module  # noqa: E402
from tests.remote.fault_proxy import FaultProxy, error, reset, slowdown, stall, truncate  # noqa: E402
from tests.remote.s3_server import WEED_MISSING, S3Server, find_weed  # noqa: E402

# The s3_server fixture skips without weed; this also covers the test that starts a server of its own.
pytestmark = pytest.mark.skipif(find_weed() is None, reason=WEED_MISSING)

MiB = 1024 * 1024
# A bare client: one attempt, short timeouts, so each fault shows as the client's first error. Not
# retries={"max_attempts": 1}: in botocore's legacy retry mode (the default) that is one *retry*, two attempts.
BARE = Config(retries={"total_max_attempts": 1}, read_timeout=1, connect_timeout=1)


def _code(e: ClientError) -> tuple[str, int]:
    return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.fixture
def obj(s3_server: S3Server, s3_bucket: str) -> Iterator[tuple[str, str, bytes]]:
    """(bucket, key, data): a 64 KiB object of random bytes, written directly to the server."""
    data = os.urandom(64 * 1024)
    key = "dir/sample 001.bin"  # a space and a slash: the proxy's key matching sees unquoted paths
    s3_server.client().put_object(Bucket=s3_bucket, Key=key, Body=data)
    yield s3_bucket, key, data


@pytest.fixture
def bare(s3_server: S3Server, fault_proxy: FaultProxy) -> Any:
    """A no-retry, 1 s-timeout boto3 client that goes through the fault proxy."""
    return s3_server.client(endpoint_url=fault_proxy.url, config=BARE)


# -- the server ------------------------------------------------------------------------------------------


def test_server_rejects_a_wrong_secret_and_accepts_the_right_one(s3_server: S3Server, s3_bucket: str) -> None:
    import boto3

    wrong = boto3.session.Session().client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name=s3_server.region,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key + "x",
        config=BARE,
    )
    with pytest.raises(ClientError) as e:
        wrong.list_objects_v2(Bucket=s3_bucket)
    assert _code(e.value) == ("SignatureDoesNotMatch", 403)
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket)["KeyCount"] == 0


def test_ranged_get_returns_exactly_the_bytes(s3_server: S3Server, obj: tuple[str, str, bytes]) -> None:
    bucket, key, data = obj
    client = s3_server.client()
    got = client.get_object(Bucket=bucket, Key=key, Range="bytes=1000-1999")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == f"bytes 1000-1999/{len(data)}"
    assert got["Body"].read() == data[1000:2000]
    assert client.get_object(Bucket=bucket, Key=key, Range="bytes=-10")["Body"].read() == data[-10:]


def test_if_match_is_honoured_on_whole_and_ranged_gets(s3_server: S3Server, obj: tuple[str, str, bytes]) -> None:
    """What S3Store's pinned reads rely on (it also checks each response's ETag, for servers that do not)."""
    bucket, key, data = obj
    client = s3_server.client(config=BARE)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"][0]["ETag"]
    assert client.head_object(Bucket=bucket, Key=key)["ETag"] == listed  # one ETag for list, HEAD and GET
    ranged = client.get_object(Bucket=bucket, Key=key, IfMatch=listed, Range="bytes=10-19")
    assert ranged["ETag"] == listed and ranged["Body"].read() == data[10:20]
    for extra in ({}, {"Range": "bytes=10-19"}):
        with pytest.raises(ClientError) as e:
            client.get_object(Bucket=bucket, Key=key, IfMatch='"0123456789abcdef0123456789abcdef"', **extra)
        assert _code(e.value) == ("PreconditionFailed", 412)


def test_the_signature_covers_the_host_header(s3_server: S3Server, s3_bucket: str) -> None:
    """Why the proxy forwards the client's Host unchanged: a request signed for one host and presented
    with another is refused (and the same request with the signed Host is accepted)."""
    creds = Credentials(s3_server.access_key, s3_server.secret_key)
    port = urlsplit(s3_server.endpoint_url).port
    assert port is not None

    def signed_get(signed_host: str) -> dict[str, str]:
        request = AWSRequest(method="GET", url=f"http://{signed_host}/{s3_bucket}?list-type=2")
        request.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
        SigV4Auth(creds, "s3", s3_server.region).add_auth(request)
        return dict(request.headers.items())

    def send(headers: dict[str, str]) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", f"/{s3_bucket}?list-type=2", headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    status, _ = send(signed_get(f"127.0.0.1:{port}"))
    assert status == 200
    status, body = send({**signed_get("127.0.0.1:1"), "Host": f"127.0.0.1:{port}"})
    assert status == 403 and b"SignatureDoesNotMatch" in body


def test_start_retries_on_a_port_clash_and_stop_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port taken between the probe and weed's bind: weed exits, start() goes again on fresh ports."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real_free_ports = s3_server_module._free_ports
    draws: list[list[int]] = []

    def first_draw_clashes(n: int) -> list[int]:
        ports = real_free_ports(n)
        if not draws:
            ports[6] = taken.getsockname()[1]  # the S3 port of the first attempt
        draws.append(ports)
        return ports

    monkeypatch.setattr(s3_server_module, "_free_ports", first_draw_clashes)
    try:
        server = S3Server.start(tmp_path)
    finally:
        taken.close()
    try:
        assert len(draws) == 2
        assert server.endpoint_url == f"http://127.0.0.1:{draws[1][6]}"
        assert server.client().list_buckets()["Buckets"] == []
        assert server.secret_key not in repr(server)
    finally:
        server.stop()
    assert server.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(server.process.pid, 0)  # the whole group is gone


# -- the proxy without rules -----------------------------------------------------------------------------


def test_proxy_forwards_put_get_head_list_and_ranges(
    s3_server: S3Server, s3_bucket: str, fault_proxy: FaultProxy
) -> None:
    client = s3_server.client(endpoint_url=fault_proxy.url)
    data = os.urandom(300 * 1024)
    client.put_object(Bucket=s3_bucket, Key="a/one.bin", Body=data)
    client.put_object(Bucket=s3_bucket, Key="a/two.bin", Body=b"")
    assert client.get_object(Bucket=s3_bucket, Key="a/one.bin")["Body"].read() == data
    assert client.get_object(Bucket=s3_bucket, Key="a/one.bin", Range="bytes=5-9")["Body"].read() == data[5:10]
    assert client.get_object(Bucket=s3_bucket, Key="a/two.bin")["Body"].read() == b""
    assert client.head_object(Bucket=s3_bucket, Key="a/one.bin")["ContentLength"] == len(data)
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="a/")
    assert [o["Key"] for o in listed["Contents"]] == ["a/one.bin", "a/two.bin"]
    with pytest.raises(ClientError) as e:
        client.head_object(Bucket=s3_bucket, Key="a/missing")
    assert _code(e.value)[1] == 404
    # Every request went through the proxy, unfaulted, and the direct upload was really stored.
    assert s3_server.client().get_object(Bucket=s3_bucket, Key="a/one.bin")["Body"].read() == data
    assert fault_proxy.count("PUT", "/a/") == 2
    assert fault_proxy.count("GET", "a/one.bin") == 2
    assert fault_proxy.count("HEAD") == 2
    assert fault_proxy.count(fault=None) == len(fault_proxy.requests) == 8
    # boto3 keeps its connection alive: eight requests, one client connection.
    assert fault_proxy.connections == 1


def test_proxy_carries_a_multipart_upload(
    s3_server: S3Server, s3_bucket: str, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    path = tmp_path / "big.bin"
    data = os.urandom(12 * MiB)
    path.write_bytes(data)
    client = s3_server.client(endpoint_url=fault_proxy.url)
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=2)
    client.upload_file(str(path), s3_bucket, "big.bin", Config=config)
    assert fault_proxy.count("POST", "big.bin?uploads") == 1
    assert fault_proxy.count("PUT", "partNumber=") == 3  # 5 + 5 + 2 MiB
    assert fault_proxy.count("POST", "big.bin?uploadId=") == 1  # CompleteMultipartUpload
    assert s3_server.client().get_object(Bucket=s3_bucket, Key="big.bin")["Body"].read() == data


def test_proxy_forwards_a_chunked_request_body(s3_server: S3Server, s3_bucket: str, fault_proxy: FaultProxy) -> None:
    """A PUT with Transfer-Encoding: chunked (what a client streaming a body of unknown length sends)."""
    creds = Credentials(s3_server.access_key, s3_server.secret_key)
    proxy = urlsplit(fault_proxy.url)
    assert proxy.hostname is not None and proxy.port is not None
    data = os.urandom(200_000)
    request = AWSRequest(method="PUT", url=f"{fault_proxy.url}/{s3_bucket}/chunked.bin")
    request.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    request.headers["Transfer-Encoding"] = "chunked"
    SigV4Auth(creds, "s3", s3_server.region).add_auth(request)
    conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=10)
    try:
        pieces = (data[i : i + 65536] for i in range(0, len(data), 65536))
        conn.request(
            "PUT", f"/{s3_bucket}/chunked.bin", body=pieces, headers=dict(request.headers.items()), encode_chunked=True
        )
        response = conn.getresponse()
        assert (response.status, response.read()[:200]) == (200, b"")
    finally:
        conn.close()
    assert s3_server.client().get_object(Bucket=s3_bucket, Key="chunked.bin")["Body"].read() == data


# -- each fault, as a bare client sees it ----------------------------------------------------------------


def test_slowdown_is_a_503_slowdown_then_expires(
    bare: Any, fault_proxy: FaultProxy, obj: tuple[str, str, bytes]
) -> None:
    bucket, key, data = obj
    rule = fault_proxy.add(slowdown(method="GET", key=key))
    with pytest.raises(ClientError) as e:
        bare.get_object(Bucket=bucket, Key=key)
    assert _code(e.value) == ("SlowDown", 503)
    assert e.value.response["Error"]["Message"] == "Please reduce your request rate."
    assert "retry-after" not in e.value.response["ResponseMetadata"]["HTTPHeaders"]
    assert bare.get_object(Bucket=bucket, Key=key)["Body"].read() == data  # times=1: the next one passes
    assert rule.hits == 1 and rule.exhausted
    assert fault_proxy.count("GET", key) == 2
    assert fault_proxy.count("GET", key, fault="error") == 1


def test_error_rule_any_status_and_code(bare: Any, fault_proxy: FaultProxy, obj: tuple[str, str, bytes]) -> None:
    bucket, key, data = obj
    fault_proxy.add(error(500, "InternalError", method="GET", key=key, times=2))
    fault_proxy.add(error(404, "NoSuchKey", method="GET", key=key))
    for expected in [("InternalError", 500), ("InternalError", 500), ("NoSuchKey", 404)]:
        with pytest.raises(ClientError) as e:
            bare.get_object(Bucket=bucket, Key=key)
        assert _code(e.value) == expected
    assert bare.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    # A HEAD error has no body: botocore only sees the status.
    fault_proxy.add(error(503, "SlowDown", method="HEAD", key=key))
    with pytest.raises(ClientError) as e:
        bare.head_object(Bucket=bucket, Key=key)
    assert _code(e.value)[1] == 503
    assert bare.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(data)


def test_stall_makes_the_client_time_out(bare: Any, fault_proxy: FaultProxy, obj: tuple[str, str, bytes]) -> None:
    bucket, key, data = obj
    fault_proxy.add(stall(10, method="GET", key=key))
    start = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        bare.get_object(Bucket=bucket, Key=key)
    assert time.monotonic() - start < 4  # read_timeout=1, not the 10 s stall
    assert bare.get_object(Bucket=bucket, Key=key)["Body"].read() == data


@pytest.mark.parametrize("nbytes", [0, 1000])
def test_truncate_cuts_the_body_short(
    bare: Any, fault_proxy: FaultProxy, obj: tuple[str, str, bytes], nbytes: int
) -> None:
    bucket, key, data = obj
    fault_proxy.add(truncate(nbytes, method="GET", key=key))
    got = bare.get_object(Bucket=bucket, Key=key)
    assert got["ContentLength"] == len(data)  # the real headers
    with pytest.raises((IncompleteReadError, ResponseStreamingError)):
        got["Body"].read()
    assert bare.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def test_truncate_as_seen_on_the_wire(
    fault_proxy: FaultProxy, obj: tuple[str, str, bytes], s3_server: S3Server
) -> None:
    """The client gets the real Content-Length and exactly ``nbytes`` of the body, then EOF."""
    bucket, key, data = obj
    fault_proxy.add(truncate(1000, method="GET", key=key))
    proxy = urlsplit(fault_proxy.url)
    request = AWSRequest(method="GET", url=f"{fault_proxy.url}/{bucket}/{key.replace(' ', '%20')}")
    request.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    SigV4Auth(Credentials(s3_server.access_key, s3_server.secret_key), "s3", s3_server.region).add_auth(request)
    assert proxy.hostname is not None and proxy.port is not None
    with socket.create_connection((proxy.hostname, proxy.port), timeout=10) as sock:
        path = urlsplit(request.url).path
        headers = {"Host": proxy.netloc, **dict(request.headers.items())}  # the signature covers Host
        head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(head.encode() + b"\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    response_head, _, body = received.partition(b"\r\n\r\n")
    assert response_head.startswith(b"HTTP/1.1 200")
    assert f"content-length: {len(data)}".encode() in response_head.lower()
    assert body == data[:1000]


def test_reset_is_a_connection_error(bare: Any, fault_proxy: FaultProxy, obj: tuple[str, str, bytes]) -> None:
    bucket, key, data = obj
    fault_proxy.add(reset(method="GET", key=key))
    with pytest.raises(ConnectionClosedError):
        bare.get_object(Bucket=bucket, Key=key)
    assert bare.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    assert fault_proxy.count("GET", key, fault="reset") == 1


# -- matching, expiry, counting --------------------------------------------------------------------------


def test_rules_match_method_and_key_only(bare: Any, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    for name in ("a.bin", "b.bin"):
        bare.put_object(Bucket=s3_bucket, Key=name, Body=name.encode())
    rule = fault_proxy.add(slowdown(method="GET", key="a.bin", times=None))  # forever
    assert bare.get_object(Bucket=s3_bucket, Key="b.bin")["Body"].read() == b"b.bin"
    assert bare.head_object(Bucket=s3_bucket, Key="a.bin")["ContentLength"] == 5
    for _ in range(3):
        with pytest.raises(ClientError):
            bare.get_object(Bucket=s3_bucket, Key="a.bin")
    assert rule.hits == 3 and not rule.exhausted
    fault_proxy.clear()
    assert bare.get_object(Bucket=s3_bucket, Key="a.bin")["Body"].read() == b"a.bin"
    assert fault_proxy.count("GET", "a.bin") == 4
    assert fault_proxy.count("GET", "a.bin", fault=None) == 1
    fault_proxy.reset_requests()
    assert fault_proxy.count() == 0


def test_retries_show_in_the_counts(s3_server: S3Server, fault_proxy: FaultProxy, obj: tuple[str, str, bytes]) -> None:
    """A retrying client gets through two SlowDowns; the proxy saw all three attempts."""
    bucket, key, data = obj
    client = s3_server.client(
        endpoint_url=fault_proxy.url, config=Config(retries={"max_attempts": 3, "mode": "standard"})
    )
    fault_proxy.add(slowdown(method="GET", key=key, times=2))
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    assert [r.fault for r in fault_proxy.requests if r.method == "GET"] == ["error", "error", None]


# -- s3_env ----------------------------------------------------------------------------------------------


def test_s3_env_points_sdks_at_the_server(s3_env: S3Server, s3_bucket: str) -> None:
    """Code that builds its client from the environment alone (no endpoint, no keys) reaches the test server."""
    import boto3

    s3_env.client().put_object(Bucket=s3_bucket, Key="env.txt", Body=b"from the env")
    client = boto3.session.Session().client("s3")
    assert client.meta.endpoint_url == s3_env.endpoint_url
    assert client.get_object(Bucket=s3_bucket, Key="env.txt")["Body"].read() == b"from the env"
    assert not Path(os.environ["AWS_CONFIG_FILE"]).exists()
    obstore = pytest.importorskip("obstore")
    from obstore.store import S3Store

    assert bytes(obstore.get(S3Store(s3_bucket), "env.txt").bytes()) == b"from the env"
