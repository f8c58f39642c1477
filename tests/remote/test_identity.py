"""A remote shard is its key and its version (ETag), never its base name or its size: indexes and cached
bytes are kept under that identity, and every read is pinned to it, so a replaced object is an error
naming it, never bytes read through the index of another version. Against the real SeaweedFS server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fastloader.datasets import TarShardDataset
from fastloader.errors import ObjectChanged
from fastloader.remote.retry import RetryPolicy
from fastloader.remote.s3 import S3Store
from fastloader.remote.url import S3Url
from tests.remote import fault_proxy as faults
from tests.remote.shards import identity, put, read_all, samples, tar_bytes

PER_SHARD = 6


def test_shards_of_one_name_under_two_prefixes_keep_their_own_index(
    s3_env: Any, s3_bucket: str, tmp_path: Path
) -> None:
    client = s3_env.client()
    first, second = samples(0, PER_SHARD, label=1, seed=1), samples(0, PER_SHARD, label=2, seed=2)
    assert len(tar_bytes(first)) == len(tar_bytes(second))  # the same size: only content tells them apart
    put(client, s3_bucket, "ds/p1/shard.tar", tar_bytes(first))
    put(client, s3_bucket, "ds/p2/shard.tar", tar_bytes(second))
    dataset = TarShardDataset(f"s3://{s3_bucket}/ds", decode=identity, shard_cache=tmp_path / "cache")
    assert read_all(dataset) == [(data, label) for _, data, label in first + second]
    assert dataset.source.key(PER_SHARD).startswith(f"s3://{s3_bucket}/ds/p2/shard.tar:")


def test_a_shard_replaced_by_one_of_the_same_size_is_indexed_and_read_anew(
    s3_env: Any, s3_bucket: str, tmp_path: Path
) -> None:
    client = s3_env.client()
    old, new = samples(0, PER_SHARD, label=3, seed=3), samples(0, PER_SHARD, label=4, seed=4)
    put(client, s3_bucket, "plain/a.tar", tar_bytes(old))
    url, cache = f"s3://{s3_bucket}/plain", tmp_path / "cache"
    assert read_all(TarShardDataset(url, decode=identity, shard_cache=cache)) == [(d, lab) for _, d, lab in old]
    put(client, s3_bucket, "plain/a.tar", tar_bytes(new))  # same key, same size: the old one is cached
    again = TarShardDataset(url, decode=identity, shard_cache=cache)
    assert read_all(again) == [(d, lab) for _, d, lab in new]  # neither the old index nor the old bytes


def test_a_shard_replaced_after_indexing_is_an_error_naming_it(s3_env: Any, s3_bucket: str, tmp_path: Path) -> None:
    client = s3_env.client()
    for name, seed in (("a", 5), ("b", 6)):
        put(client, s3_bucket, f"repl/{name}.tar", tar_bytes(samples(0, PER_SHARD, label=1, seed=seed)))
    size = len(tar_bytes(samples(0, PER_SHARD, label=1)))
    # Room for one shard: indexing b evicts a, so reading a fetches it again, after it was replaced.
    dataset = TarShardDataset(
        f"s3://{s3_bucket}/repl", decode=identity, shard_cache=tmp_path / "c", shard_cache_limit=size + 1
    )
    put(client, s3_bucket, "repl/a.tar", tar_bytes(samples(0, PER_SHARD, label=2, seed=7)))
    with pytest.raises(ObjectChanged) as caught:
        dataset[0]
    message = str(caught.value)
    assert f"s3://{s3_bucket}/repl/a.tar: the object was replaced since this reader indexed it" in message
    assert "create the dataset again" in message
    assert dataset[PER_SHARD][1] == 1  # b is unchanged: still read


def test_a_cut_body_is_never_resumed_from_another_version(
    s3_env: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    client = s3_env.client()
    old = tar_bytes(samples(0, PER_SHARD, label=1, seed=8))
    new = tar_bytes(samples(0, PER_SHARD, label=2, seed=9))
    assert len(old) == len(new)
    put(client, s3_bucket, "cut/a.tar", old)
    store = S3Store(fault_proxy.url, retry=RetryPolicy(attempts=4, base_s=0.01, cap_s=0.02))
    fault_proxy.add(faults.truncate(2000, method="GET", key="cut/a.tar", times=1))
    get_object = store.client.get_object
    calls = []

    def replaced_before_the_resume(**kwargs: Any) -> Any:
        calls.append(kwargs)
        if len(calls) == 2:  # the first body was cut at 2000 bytes: now the object changes
            put(client, s3_bucket, "cut/a.tar", new)
        return get_object(**kwargs)

    store.client.get_object = replaced_before_the_resume
    with pytest.raises(ObjectChanged, match=rf"s3://{s3_bucket}/cut/a.tar: the object was replaced"):
        store.download(S3Url(s3_bucket, "cut/a.tar"), str(tmp_path / "a.tar"))
    assert calls[1]["Range"] == "bytes=2000-" and calls[1]["IfMatch"] == calls[0]["IfMatch"]
    assert fault_proxy.count("GET", "cut/a.tar", fault="truncate") == 1


def test_a_server_that_ignores_if_match_is_caught_by_the_etag_check(
    s3_env: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = s3_env.client()
    etag = put(client, s3_bucket, "lax/a.tar", b"version one")
    put(client, s3_bucket, "lax/a.tar", b"version two")
    store = S3Store(s3_env.endpoint_url)
    get_object = store.client.get_object

    def without_if_match(**kwargs: Any) -> Any:  # what a server that ignores the header answers
        kwargs.pop("IfMatch", None)
        return get_object(**kwargs)

    monkeypatch.setattr(store.client, "get_object", without_if_match)
    for start, end in ((None, None), (0, 4)):
        with pytest.raises(ObjectChanged, match=rf"lax/a.tar: the object was replaced .*ETag {etag}"):
            store.get(S3Url(s3_bucket, "lax/a.tar"), start, end, etag=etag)
    assert store.get(S3Url(s3_bucket, "lax/a.tar")) == b"version two"
