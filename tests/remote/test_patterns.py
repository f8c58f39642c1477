"""WebDataset's URL conventions for s3:// as for local paths: brace patterns, lists of URLs and globs name
the shards; a name that is not there is an error naming it. Against the real SeaweedFS server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fastloader.datasets import TarShardDataset
from tests.remote.shards import Sample, identity, put, read_all, samples, tar_bytes


@pytest.fixture
def shards(s3_env: Any, s3_bucket: str) -> list[list[Sample]]:
    """train/train-000000..000003.tar (labels 0-3), beside other.tar and sub/train-000009.tar."""
    client = s3_env.client()
    made = [samples(3 * n, 3, label=n) for n in range(4)]
    for n, items in enumerate(made):
        put(client, s3_bucket, f"train/train-{n:06d}.tar", tar_bytes(items))
    put(client, s3_bucket, "train/other.tar", tar_bytes(samples(100, 2, label=8)))
    put(client, s3_bucket, "train/sub/train-000009.tar", tar_bytes(samples(200, 2, label=9)))
    return made


def _items(*shards: list[Sample]) -> list[tuple[bytes, int]]:
    return [(data, label) for shard in shards for _, data, label in shard]


def test_braces_lists_and_globs_name_s3_shards(shards: list[list[Sample]], s3_bucket: str, tmp_path: Path) -> None:
    base = f"s3://{s3_bucket}/train"
    every = _items(*shards)
    for pattern in (
        f"{base}/train-{{000000..000003}}.tar",
        [f"{base}/train-{n:06d}.tar" for n in range(4)],
        f"{base}/train-*.tar",  # not other.tar, not sub/: a glob part never crosses a "/"
        f"{base}/train-00000[0-3].tar",
        [f"{base}/train-{{000000,000001}}.tar", f"{base}/train-00000[23].tar"],
    ):
        dataset = TarShardDataset(pattern, decode=identity, shard_cache=tmp_path / "cache")
        assert read_all(dataset) == every, pattern
        assert dataset.classes is None
    listed = TarShardDataset([f"{base}/train-000003.tar", f"{base}/train-000000.tar"], decode=identity)
    assert read_all(listed) == _items(shards[3], shards[0])  # in the order given
    assert read_all(TarShardDataset(f"{base}/train-000002.tar", decode=identity)) == _items(shards[2])
    deeper = TarShardDataset(f"s3://{s3_bucket}/*/sub/train-*.tar", decode=identity)
    assert [label for _, label in read_all(deeper)] == [9, 9]


def test_a_pattern_naming_what_is_not_there_says_which(shards: list[list[Sample]], s3_bucket: str) -> None:
    base = f"s3://{s3_bucket}/train"
    with pytest.raises(FileNotFoundError, match=r"train/train-000004\.tar: no such object \(from pattern"):
        TarShardDataset(f"{base}/train-{{000000..000004}}.tar")
    with pytest.raises(FileNotFoundError, match=r"no object matches .*/train/val-\*\.tar"):
        TarShardDataset(f"{base}/val-*.tar")
    with pytest.raises(ValueError, match="cannot mix s3:// URLs and local paths"):
        TarShardDataset([f"{base}/train-000000.tar", "/data/train-000001.tar"])
