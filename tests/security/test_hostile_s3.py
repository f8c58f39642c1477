"""Remote reads are bounded by what the reader knows, not by what the server says: a body is never read or
written past the size listed (or announced) for it, and a server that trickles bytes is cut at the
request's deadline, then retried, then a RemoteError naming the object. Against a fake endpoint on
loopback (tests/remote/fake_s3.py) that lies and trickles on purpose."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fastloader.datasets.remote_tar import RemoteTarShardSource
from fastloader.errors import FormatError, RemoteError
from fastloader.remote.retry import RetryPolicy
from fastloader.remote.s3 import S3Store
from fastloader.remote.url import S3Url
from tests.remote.fake_s3 import ETAG, FakeS3, list_page, wait_quiet

QUICK = RetryPolicy(attempts=2, base_s=0.01, cap_s=0.01)
URL = S3Url("bucket", "shards/shard-000001.tar")


@pytest.fixture(autouse=True)
def _credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # botocore signs every request: any key does for the fake; nothing of the developer's ~/.aws is read.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fake-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-key")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)


def _fake(**kwargs: int | float | None) -> Iterator[FakeS3]:
    fake = FakeS3(**kwargs).start()  # type: ignore[arg-type]
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def lying_length() -> Iterator[FakeS3]:
    """Announces 3 GB; would send 64 MB of it."""
    yield from _fake(announce=3 << 30, send=64 << 20)


@pytest.fixture
def unannounced() -> Iterator[FakeS3]:
    """No Content-Length: streams 64 MB, then closes."""
    yield from _fake(announce=None, send=64 << 20)


@pytest.fixture
def trickle() -> Iterator[FakeS3]:
    """200 bytes announced, one every 0.5 s: 100 s for the whole body."""
    yield from _fake(announce=200, send=200, piece=1, pause_s=0.5)


def test_get_refuses_a_body_announced_longer_than_expected_before_reading_it(lying_length: FakeS3) -> None:
    store = S3Store(lying_length.url, retry=QUICK)
    with pytest.raises(RemoteError) as raised:
        store.get(URL, size=200)
    message = str(raised.value)
    assert URL.key in message and "200" in message and str(3 << 30) in message
    assert lying_length.requests == 1  # refused for good: the object is what it is, no retry
    wait_quiet(lying_length)
    assert lying_length.sent < 32 << 20  # socket buffers at most, never the body


def test_get_reads_at_most_one_byte_past_the_listed_size(unannounced: FakeS3) -> None:
    store = S3Store(unannounced.url, retry=QUICK)
    with pytest.raises(RemoteError) as raised:
        store.get(URL, size=200)
    assert URL.key in str(raised.value) and "200" in str(raised.value)
    wait_quiet(unannounced)
    assert unannounced.sent < 32 << 20


def test_get_without_a_listed_size_trusts_no_more_than_the_announced_length(lying_length: FakeS3) -> None:
    # What the old reader did with a lying length: read until the server stopped, gigabytes in memory.
    store = S3Store(lying_length.url, retry=QUICK)
    with pytest.raises(RemoteError, match="more than|announces|failed"):
        store.get(URL, 0, 100)  # a range: exactly its 100 bytes are expected
    wait_quiet(lying_length)
    assert lying_length.sent < 32 << 20


def test_download_never_writes_past_the_listed_size(unannounced: FakeS3, tmp_path: Path) -> None:
    store = S3Store(unannounced.url, retry=QUICK)
    dest = tmp_path / "shard.tar"
    with pytest.raises(RemoteError) as raised:
        store.download(URL, str(dest), 10_000, etag=ETAG)
    message = str(raised.value)
    assert URL.key in message and "10000" in message
    assert dest.stat().st_size <= 10_000
    wait_quiet(unannounced)
    assert unannounced.sent < 32 << 20


def test_download_refuses_an_announced_length_past_the_listed_size(lying_length: FakeS3, tmp_path: Path) -> None:
    store = S3Store(lying_length.url, retry=QUICK)
    dest = tmp_path / "shard.tar"
    with pytest.raises(RemoteError) as raised:
        store.download(URL, str(dest), 10_000, etag=ETAG)
    assert str(3 << 30) in str(raised.value) and "10000" in str(raised.value)
    assert dest.stat().st_size == 0
    assert lying_length.requests == 1


@pytest.mark.parametrize("call", ["get", "download"])
def test_a_trickling_server_is_cut_at_the_deadline_then_retried_then_an_error(
    trickle: FakeS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    # A byte every 0.5 s never trips the 30 s read timeout; the whole body would take 100 s (two attempts: 200 s).
    monkeypatch.setenv("FASTLOADER_S3_DEADLINE_S", "1")
    store = S3Store(trickle.url, retry=QUICK)
    began = time.monotonic()
    with pytest.raises(RemoteError) as raised:
        if call == "get":
            store.get(URL)
        else:
            store.download(URL, str(tmp_path / "shard.tar"), 200, etag=ETAG)
    took = time.monotonic() - began
    assert took < 100 / 3, f"cut after {took:.1f} s"
    assert URL.key in str(raised.value) and "deadline" in str(raised.value)
    assert "failed 2 times" in str(raised.value)  # retried first
    assert trickle.requests == 2


def test_the_deadline_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOADER_S3_DEADLINE_S", "soon")
    with pytest.raises(ValueError, match="FASTLOADER_S3_DEADLINE_S"):
        S3Store("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="deadline_s"):
        S3Store("http://127.0.0.1:9", deadline_s=0)


@contextmanager
def listing_store(listing: Callable[[str | None], bytes], **kwargs: Any) -> Iterator[tuple[S3Store, FakeS3]]:
    """A store over a fake endpoint whose listing pages ``listing(token)`` gives."""
    fake = FakeS3(announce=0, send=0, listing=listing).start()
    try:
        yield S3Store(fake.url, retry=QUICK, **kwargs), fake
    finally:
        fake.stop()


def keys_under(store: S3Store) -> list[str]:
    return [info.key for info in store.list(S3Url("bucket", "p"))]


def test_a_listing_of_several_pages_is_read_whole() -> None:
    pages = {None: (["p/a", "p/b"], "t1"), "t1": (["p/c"], "t2"), "t2": (["p/d"], None)}
    with listing_store(lambda token: list_page(*pages[token]), max_listed_keys=4) as (store, fake):
        assert keys_under(store) == ["p/a", "p/b", "p/c", "p/d"]
        assert fake.requests == 3


def test_a_listing_that_never_ends_is_refused_past_max_listed_keys() -> None:
    """Every page holds 100 keys and says there is more, with a new token: it stops at the cap."""
    with listing_store(
        lambda token: list_page([f"p/{token}-{i}" for i in range(100)], f"{token or ''}x"), max_listed_keys=2_500
    ) as (store, fake):
        with pytest.raises(RemoteError, match=r"s3://bucket/p/ \(list\): more than 2,500 keys") as raised:
            keys_under(store)
        assert "max_listed_keys" in str(raised.value)
        assert fake.requests == 26  # 25 pages of 100 keys, then the page past the cap
    with pytest.raises(ValueError, match="max_listed_keys must be a positive integer"):
        S3Store("http://127.0.0.1:9", max_listed_keys=0)


@pytest.mark.parametrize(
    ("listing", "problem", "requests"),
    [
        (lambda token: list_page([], "same"), "gives back the continuation token it was asked with", 2),
        (lambda token: list_page([], f"{token or ''}x"), "101 pages in a row hold no key", 101),
        (lambda token: list_page(["p/a"], None).replace(b"false", b"true"), "gives no continuation token", 1),
    ],
    ids=["token-given-back", "empty-pages", "no-token"],
)
def test_a_listing_whose_pages_make_no_progress_is_refused(
    listing: Callable[[str | None], bytes], problem: str, requests: int
) -> None:
    with listing_store(listing) as (store, fake):
        with pytest.raises(RemoteError, match=r"s3://bucket/p/ \(list\): the listing does not end: .*" + problem):
            keys_under(store)
        assert fake.requests == requests


def test_a_manifest_listed_larger_than_a_pack_state_may_be_is_refused_before_reading(tmp_path: Path) -> None:
    listing = lambda token: list_page(["p/fastloader-tar.json"], None, size=300 << 20)  # noqa: E731
    with listing_store(listing) as (store, fake):
        with pytest.raises(FormatError, match=r"s3://bucket/p/fastloader-tar.json: listed at 314,572,800 bytes"):
            RemoteTarShardSource("s3://bucket/p", store=store, shard_cache=tmp_path / "cache")
        assert fake.requests == 1  # the listing: the manifest is never asked for
