"""An index uploaded beside an S3 shard whose values lie: rebuilt from its shard where the pack's manifest records
its digest, else a FormatError naming it where its values reach outside the shard; never misread samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastloader.datasets.remote_tar import RemoteTarShardSource
from fastloader.errors import FormatError
from fastloader.formats.index_file import read_index, write_index
from fastloader.formats.tar_manifest import MANIFEST_NAME
from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION
from fastloader.pack import pack
from fastloader.storage import cache_dir
from tests.images import write_image_folder


@pytest.mark.parametrize(("name", "value"), [("data_size", 2**62), ("data_offset", -512)])
def test_a_lying_uploaded_index_is_refused_naming_it(
    tmp_path: Path, s3_env: Any, s3_server: Any, s3_bucket: str, name: str, value: int
) -> None:
    write_image_folder(tmp_path / "images", count=8, classes=2)
    url = f"s3://{s3_bucket}/lying"
    pack(str(tmp_path / "images"), url, shard_size=4, progress=False, workers=0)
    client = s3_server.client()
    key = next(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"] if o["Key"].endswith(".fl-idx"))
    local = tmp_path / "index.fl-idx"
    local.write_bytes(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    index = read_index(local, INDEX_KIND, INDEX_VERSION)
    arrays = {array_name: np.array(array) for array_name, array in index.arrays.items()}
    arrays[name][1] = value
    write_index(local, INDEX_KIND, INDEX_VERSION, dict(index.meta), arrays)
    client.put_object(Bucket=s3_bucket, Key=key, Body=local.read_bytes())
    # As an older pack's manifest, which records no digest of the indexes (one that does: the next test).
    manifest_key = f"lying/{MANIFEST_NAME}"
    manifest = json.loads(client.get_object(Bucket=s3_bucket, Key=manifest_key)["Body"].read())
    for shard in manifest["shards"]:
        shard.pop("index_sha256")
    client.put_object(Bucket=s3_bucket, Key=manifest_key, Body=json.dumps(manifest).encode())
    with pytest.raises(FormatError, match=r"\.fl-idx: 'data_offset' / 'data_size' reach outside"):
        RemoteTarShardSource(url, shard_cache=tmp_path / "cache")


def test_an_uploaded_index_with_labels_flipped_is_rebuilt_from_its_shard(
    tmp_path: Path, s3_env: Any, s3_server: Any, s3_bucket: str
) -> None:
    """Values that stay within the shard, so no bound catches them: every label flipped. The pack's manifest
    records the digest of each index's arrays; the index is not that one, so it is built from the shard."""
    write_image_folder(tmp_path / "images", count=8, classes=2)
    url = f"s3://{s3_bucket}/flipped"
    pack(str(tmp_path / "images"), url, shard_size=4, progress=False, workers=0)
    expected = [RemoteTarShardSource(url, shard_cache=tmp_path / "first").label(i) for i in range(8)]
    assert sorted(set(expected)) == [0, 1]
    client = s3_server.client()
    for key in [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"] if o["Key"].endswith(".fl-idx")]:
        local = tmp_path / "index.fl-idx"
        local.write_bytes(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
        index = read_index(local, INDEX_KIND, INDEX_VERSION)
        arrays = {array_name: np.array(array) for array_name, array in index.arrays.items()}
        arrays["label"] = 1 - arrays["label"]
        write_index(local, INDEX_KIND, INDEX_VERSION, dict(index.meta), arrays)
        client.put_object(Bucket=s3_bucket, Key=key, Body=local.read_bytes())
    shutil.rmtree(cache_dir() / "s3")  # the indexes this machine made: a new reader fetches the bucket's
    with pytest.warns(UserWarning, match=r"\.fl-idx: rebuilding a shard index whose arrays are not those the pack"):
        source = RemoteTarShardSource(url, shard_cache=tmp_path / "second")
    assert [source.label(i) for i in range(8)] == expected
