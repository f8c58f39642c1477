"""Training from S3: pack to a real S3-compatible server (SeaweedFS on loopback), read back through the
shard cache with workers, survive throttling, stalls, resets and cut bodies, and say which object failed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from fastloader import DataLoaderX
from fastloader.datasets import ImageDataset, TarShardDataset
from fastloader.datasets.remote_tar import RemoteTarShardSource
from fastloader.errors import FormatError, MissingField, RemoteError
from fastloader.fields.source import read_fields
from fastloader.formats.tar_manifest import MANIFEST_NAME
from fastloader.pack import pack
from fastloader.remote.retry import RetryPolicy
from fastloader.remote.s3 import S3Store
from fastloader.sample import make_sample_folder
from fastloader.samplers import ShardWindowSampler
from tests.field_items import FIELDS, FieldItems, assert_same_value, field_values
from tests.formats.test_tar_shards import index_as_version_1
from tests.remote import fault_proxy as faults

IMAGES, SHARD = 48, 10  # 5 shards


class Digests:
    """Items as (sha1 of the image bytes, label): comparable across sources, picklable for workers."""

    def __call__(self, data: bytes) -> str:
        return hashlib.sha1(data).hexdigest()


def identity_decode(data: bytes, key: str) -> bytes:
    return data


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample_folder(tmp_path_factory.mktemp("s3") / "photos", IMAGES)


@pytest.fixture
def packed(photos: Path, s3_env: Any, s3_bucket: str, tmp_path: Path) -> str:
    url = f"s3://{s3_bucket}/train"
    summary = pack(str(photos), url, shard_size=SHARD, progress=False, workers=0)
    assert summary.dst == url and summary.packed == IMAGES
    return url


def items(dataset: Any, **loader: Any) -> list[tuple[str, int]]:
    batches = DataLoaderX(dataset, batch_size=8, collate_fn=lambda b: b, **loader)
    return [(digest, int(label)) for batch in batches for digest, label in batch]


def local_items(photos: Path, tmp_path: Path) -> list[tuple[str, int]]:
    local = tmp_path / "local-tar"
    pack(str(photos), str(local), format="tar", shard_size=SHARD, progress=False, workers=0)
    return sorted(items(TarShardDataset(str(local), transform=Digests(), decode=identity_decode)))


def test_pack_uploads_shards_indexes_and_the_manifest(packed: str, s3_server: Any, s3_bucket: str) -> None:
    keys = sorted(o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"])
    shards = [k for k in keys if k.endswith(".tar")]
    assert len(shards) == 5 and len([k for k in keys if k.endswith(".tar.fl-idx")]) == 5
    assert "train/fastloader-tar.json" in keys and "train/fastloader-tar.progress.json" not in keys


def test_every_sample_once_with_workers_as_from_local_disk(
    packed: str, photos: Path, tmp_path: Path, s3_env: Any
) -> None:
    dataset = TarShardDataset(packed, transform=Digests(), decode=identity_decode, shard_cache=tmp_path / "cache")
    assert len(dataset) == IMAGES and dataset.classes is not None
    got = items(dataset, num_workers=2, sampler=ShardWindowSampler(dataset, window=2, seed=1))
    assert sorted(got) == local_items(photos, tmp_path)
    assert len(set(got)) == IMAGES


def test_the_cache_stays_under_its_limit(packed: str, tmp_path: Path, s3_env: Any) -> None:
    probe = RemoteTarShardSource(packed, shard_cache=tmp_path / "probe")
    largest = max(entry for entry in _shard_sizes(probe))
    limit = 2 * largest + 1  # room for two shards: the sampler's window
    dataset = TarShardDataset(
        packed, transform=Digests(), decode=identity_decode, shard_cache=tmp_path / "c", shard_cache_limit=limit
    )
    for epoch in range(2):
        sampler = ShardWindowSampler(dataset, window=2, seed=0)
        sampler.set_epoch(epoch)
        got = items(dataset, num_workers=2, sampler=sampler)
        assert len(got) == IMAGES and len(set(got)) == IMAGES
        assert dataset.source.stats()["shard_cache_bytes"] <= limit


def _shard_sizes(source: RemoteTarShardSource) -> list[int]:
    from fastloader.remote.url import S3Url

    return [source.store.size(S3Url.parse(url)) for url in source.shards]


def test_a_reader_never_sees_a_half_uploaded_pack(photos: Path, s3_env: Any, s3_bucket: str, s3_server: Any) -> None:
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="half/fastloader-tar.progress.json", Body=b"{}")
    client.put_object(Bucket=s3_bucket, Key="half/shard-000000.tar", Body=b"\0" * 1024)
    with pytest.raises(FormatError, match="incomplete pack upload"):
        TarShardDataset(f"s3://{s3_bucket}/half")


def test_an_epoch_survives_throttling_stalls_resets_and_cut_bodies(
    packed: str, photos: Path, tmp_path: Path, fault_proxy: Any, s3_env: Any
) -> None:
    for rule in (
        faults.slowdown(method="GET", key=".tar", times=3),
        faults.truncate(1000, method="GET", key=".tar", times=2),
        faults.reset(method="GET", key=".tar", times=2),
        faults.stall(3.0, method="GET", key=".tar", times=1),
    ):
        fault_proxy.add(rule)
    store = S3Store(fault_proxy.url, read_timeout=1.0, retry=RetryPolicy(attempts=12, base_s=0.01, cap_s=0.2))
    source = RemoteTarShardSource(packed, shard_cache=tmp_path / "cache", store=store)
    dataset = ImageDataset(source, transform=Digests(), decode=identity_decode)
    got = items(dataset, num_workers=2, sampler=ShardWindowSampler(dataset, window=2, seed=4))
    assert sorted(got) == local_items(photos, tmp_path)  # nothing lost or duplicated
    for kind in ("error", "truncate", "reset", "stall"):
        assert fault_proxy.count("GET", ".tar", fault=kind) > 0, kind  # each fault was met, and retried


def test_after_the_retry_budget_the_error_names_the_object(packed: str, tmp_path: Path, fault_proxy: Any) -> None:
    store = S3Store(fault_proxy.url, retry=RetryPolicy(attempts=3, base_s=0.01, cap_s=0.02))
    source = RemoteTarShardSource(packed, shard_cache=tmp_path / "cache", store=store)
    fault_proxy.add(faults.error(500, "InternalError", method="GET", key=".tar", times=100))
    with pytest.raises(RemoteError, match=r"s3://.*/train/.*\.tar.*failed 3 times.*InternalError"):
        source.read(0)


def test_bad_credentials_fail_at_once_without_showing_the_secret(
    packed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_env: Any
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    with pytest.raises(RemoteError) as caught:
        RemoteTarShardSource(packed, shard_cache=tmp_path / "cache", store=S3Store(retry=RetryPolicy(attempts=5)))
    assert "SignatureDoesNotMatch" in str(caught.value) and "not-the-secret-at-all" not in str(caught.value)


def test_a_killed_upload_resumes_without_sending_shards_again(
    photos: Path, s3_env: Any, s3_bucket: str, fault_proxy: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", fault_proxy.url)  # the service's own variable wins over the above
    url = f"s3://{s3_bucket}/resumed"
    fault_proxy.add(faults.error(500, "InternalError", key="shard-000002-", times=1000))
    monkeypatch.setattr("fastloader.remote.s3.RetryPolicy", lambda: RetryPolicy(attempts=2, base_s=0.01))
    with pytest.raises(RemoteError, match=r"shard-000002-[0-9a-f]{16}\.tar"):
        pack(str(photos), url, shard_size=SHARD, progress=False, workers=0)
    with pytest.raises(FormatError, match="incomplete pack upload"):
        TarShardDataset(url)
    fault_proxy.clear()
    before = fault_proxy.count("PUT", "shard-000000-")
    assert before > 0
    pack(str(photos), url, shard_size=SHARD, progress=False, workers=0)
    assert fault_proxy.count("PUT", "shard-000000-") == before  # already there: not sent again
    assert fault_proxy.count("PUT", "shard-000002-") > 0
    assert len(TarShardDataset(url, shard_cache=tmp_path / "cache")) == IMAGES


def test_fields_read_from_s3(s3_env: Any, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/fields"
    items = FieldItems(9)
    pack(items, url, shard_size=4, progress=False, workers=0)
    source = RemoteTarShardSource(url, shard_cache=tmp_path / "cache")
    assert source.field_kinds() == dict(sorted(FIELDS.items())) and len(source) == 9
    for i in (8, 0, 5, 1):
        assert read_fields(source, i).keys() == field_values(i).keys()
        for name, value in field_values(i).items():
            assert_same_value(source.read_field(i, name), value, f"{i} {name}")
    with pytest.raises(MissingField, match=r"shard-000000-[0-9a-f]{16}\.tar:000000002: no field 'Caption'"):
        source.read_field(2, "Caption")


class CountingStore(S3Store):
    """An S3Store that records the objects it downloads whole (shards, for the shard cache)."""

    downloads: list[str]

    def download(self, url: Any, path: str, size: int | None = None, *, etag: str | None = None) -> int:
        self.downloads.append(str(url))
        return super().download(url, path, size, etag=etag)


def test_a_pack_uploaded_by_the_previous_version_reads_without_fetching_shards(
    packed: str, s3_server: Any, s3_bucket: str, tmp_path: Path, s3_env: Any
) -> None:
    client = s3_server.client()
    for key in [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]]:
        local = tmp_path / "object"
        local.write_bytes(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
        if key.endswith(".fl-idx"):
            index_as_version_1(local)  # as version 1 uploaded them: no member arrays
        elif key.endswith(MANIFEST_NAME):
            manifest = json.loads(local.read_bytes())
            del manifest["fields"]
            local.write_text(json.dumps({**manifest, "version": 1}))
        else:
            continue
        client.put_object(Bucket=s3_bucket, Key=key, Body=local.read_bytes())
    store = CountingStore()
    store.downloads = []
    source = RemoteTarShardSource(packed, shard_cache=tmp_path / "cache", store=store)
    assert len(source) == IMAGES and source.classes is not None and source.field_kinds() == {}
    assert store.downloads == [], "the old indexes were upgraded, not rebuilt from the shards"
    assert source.source_key(0) is not None and source.read(IMAGES - 1)
    assert len(store.downloads) == 1
