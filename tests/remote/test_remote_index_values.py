"""An index uploaded beside an S3 shard whose values lie: a FormatError naming it, never misread samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastloader.datasets.remote_tar import RemoteTarShardSource
from fastloader.errors import FormatError
from fastloader.formats.index_file import read_index, write_index
from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION
from fastloader.pack import pack
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
    with pytest.raises(FormatError, match=r"\.fl-idx: 'data_offset' / 'data_size' reach outside"):
        RemoteTarShardSource(url, shard_cache=tmp_path / "cache")
