"""Packing again to an S3 prefix: the bucket then serves the new pack, sample by sample; only the shards that
changed are sent; and a reader, whenever it opens the prefix, sees one pack whole, never a manifest next to
shards of another. Against the real SeaweedFS server (through the fault proxy, to count the uploads)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from fastloader.datasets import TarShardDataset
from fastloader.errors import ObjectChanged
from fastloader.formats.tar_manifest import MANIFEST_NAME
from fastloader.pack import pack
from fastloader.remote.s3 import S3Store
from fastloader.remote.url import S3Url
from tests.images import image_bytes
from tests.remote.shards import identity, read_all

SHARD = 4  # three shards: one per class


def _folder(root: Path) -> Path:
    """c0/0000-0003, c1/0004-0007, c2/0008-0011: each class one shard."""
    for index in range(12):
        (root / f"c{index // 4}").mkdir(parents=True, exist_ok=True)
        (root / f"c{index // 4}" / f"{index:04d}.jpg").write_bytes(image_bytes(index, seed=11))
    return root


def _change(root: Path) -> None:
    """Move c0/0003 to c1, where it still sorts fourth (same place, label 0 -> 1: shard 0 keeps its size),
    and replace c1/0005 by another image (shard 1 changes size). Shard 2 stays as it was."""
    shutil.move(root / "c0" / "0003.jpg", root / "c1" / "0003.jpg")
    (root / "c1" / "0005.jpg").write_bytes(image_bytes(99, seed=12))


def _expected(root: Path) -> list[tuple[bytes, int]]:
    classes = sorted(path.name for path in root.iterdir())
    return [
        (path.read_bytes(), label) for label, name in enumerate(classes) for path in sorted((root / name).iterdir())
    ]


def _reader(url: str, cache: Path) -> TarShardDataset:
    return TarShardDataset(url, decode=identity, shard_cache=cache)


def _keys(s3_env: Any, bucket: str) -> list[str]:
    return sorted(item["Key"] for item in s3_env.client().list_objects_v2(Bucket=bucket)["Contents"])


def test_a_repack_after_a_label_change_serves_the_new_labels_and_sends_only_what_changed(
    s3_env: Any, s3_bucket: str, fault_proxy: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", fault_proxy.url)  # the service's own variable wins over the above
    src, url = _folder(tmp_path / "src"), f"s3://{s3_bucket}/ds"
    pack(str(src), url, shard_size=SHARD, progress=False, workers=0)
    assert read_all(_reader(url, tmp_path / "c1")) == _expected(src)
    _change(src)
    fault_proxy.reset_requests()
    pack(str(src), url, shard_size=SHARD, progress=False, workers=0)
    new = _expected(src)
    assert new[3][1] == 1 and read_all(_reader(url, tmp_path / "c2")) == new  # the new labels, sample by sample
    assert fault_proxy.count("PUT", "/ds/shard-000000-") == 2  # the shard and its index
    assert fault_proxy.count("PUT", "/ds/shard-000001-") == 2
    assert fault_proxy.count("PUT", "/ds/shard-000002-") == 0  # unchanged: not sent again
    keys = _keys(s3_env, s3_bucket)
    assert len([k for k in keys if k.endswith(".tar")]) == 3  # the previous pack's shards are gone
    assert len([k for k in keys if k.endswith(".tar.fl-idx")]) == 3 and f"ds/{MANIFEST_NAME}" in keys


class _WatchedStore(S3Store):
    """The uploader's store: reads the prefix with fresh readers just before and just after the manifest."""

    seen: dict[str, list[tuple[bytes, int]]] = {}
    cache: Path

    def put(self, url: S3Url, data: bytes) -> None:
        if url.key.endswith(MANIFEST_NAME):
            prefix = f"s3://{url.bucket}/{url.key.rsplit('/', 1)[0]}"
            self.seen["before"] = read_all(_reader(prefix, self.cache / "before"))
            super().put(url, data)
            self.seen["after"] = read_all(_reader(prefix, self.cache / "after"))  # old shards still there
            return
        super().put(url, data)


def test_a_reader_during_an_overwrite_sees_one_pack_whole(
    s3_env: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    src, url = _folder(tmp_path / "src"), f"s3://{s3_bucket}/ow"
    pack(str(src), url, shard_size=SHARD, progress=False, workers=0)
    old = _expected(src)
    opened_before = _reader(url, tmp_path / "early")  # indexed from the .fl-idx objects: no shard fetched yet
    _change(src)
    _WatchedStore.cache = tmp_path / "watch"
    monkeypatch.setattr("fastloader.pack.remote.S3Store", _WatchedStore)
    pack(str(src), url, shard_size=SHARD, progress=False, workers=0)
    assert _WatchedStore.seen["before"] == old  # every new shard uploaded, the old manifest: the old pack
    assert _WatchedStore.seen["after"] == _expected(src)  # the new manifest: the new pack, whole
    with pytest.raises(ObjectChanged, match=r"/ow/shard-000000-[0-9a-f]{16}\.tar: the object was deleted"):
        opened_before[0]  # its shard is gone: an error naming it, never another pack's bytes
    assert opened_before[8] == old[8]  # shard 2 did not change: the very same object serves both packs
