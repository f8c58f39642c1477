"""The manifest of a pack on S3 is checked as a local one is (``TarPackState.read``): a manifest listing a
shard twice would serve its samples twice, so the reader refuses it, naming the manifest and the shard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fastloader.datasets import TarShardDataset
from fastloader.errors import FormatError
from fastloader.formats.tar_manifest import MANIFEST_NAME
from fastloader.pack import pack
from tests.images import write_image_folder


def test_a_manifest_on_s3_listing_a_shard_twice_is_refused(
    tmp_path: Path, s3_env: Any, s3_server: Any, s3_bucket: str
) -> None:
    write_image_folder(tmp_path / "images", count=30)
    url = f"s3://{s3_bucket}/ds"
    pack(str(tmp_path / "images"), url, shard_size=10, workers=0, progress=False)
    assert len(TarShardDataset(url, shard_cache=tmp_path / "cache")) == 30
    client, key = s3_server.client(), f"ds/{MANIFEST_NAME}"
    manifest = json.loads(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    first = manifest["shards"][0]
    manifest["shards"].append({**first, "end_position": 40})  # 40 items, 30 distinct: the numbers agree otherwise
    client.put_object(Bucket=s3_bucket, Key=key, Body=json.dumps({**manifest, "position": 40, "count": 40}).encode())
    with pytest.raises(FormatError, match=f"{MANIFEST_NAME}: shard '{first['name']}' is listed twice"):
        TarShardDataset(url, shard_cache=tmp_path / "cache2")
