"""ShardWindowSampler: every sample once, a few shards at a time, deterministic, split over ranks, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastloader.samplers import ShardWindowSampler

STARTS = np.array([0, 10, 25, 25, 40, 52, 60, 75])  # 7 shards, one of them empty


def shard_of(index: int) -> int:
    return int(np.searchsorted(STARTS, index, side="right")) - 1


def blocks(order: list[int]) -> list[set[int]]:
    """Cut the order where every shard begun so far is complete: the shards read between two cuts."""
    sizes = np.diff(STARTS)
    left = sizes.copy()
    result: list[set[int]] = [set()]
    for index in order:
        shard = shard_of(index)
        result[-1].add(shard)
        left[shard] -= 1
        if all(left[s] == 0 for s in result[-1]):
            result.append(set())
    return [block for block in result if block]


@pytest.mark.parametrize("window", [1, 2, 3])
def test_every_sample_once_and_a_window_of_shards_at_a_time(window: int) -> None:
    sampler = ShardWindowSampler(STARTS, window=window, seed=3)
    order = list(sampler)
    assert sorted(order) == list(range(75)) and len(sampler) == 75
    assert all(len(block) <= window for block in blocks(order))  # never more than `window` shards open
    shards = [shard_of(i) for i in order]
    if window > 1:  # samples are shuffled within a window, not read shard after shard
        assert sum(1 for a, b in zip(shards, shards[1:]) if a != b) > 2 * 6


def test_deterministic_in_seed_and_epoch() -> None:
    a, b = ShardWindowSampler(STARTS, seed=1), ShardWindowSampler(STARTS, seed=1)
    assert list(a) == list(b)
    a.set_epoch(1)
    assert list(a) != list(b) and sorted(a) == sorted(b)
    assert list(ShardWindowSampler(STARTS, seed=2)) != list(b)
    assert list(ShardWindowSampler(STARTS, shuffle=False)) == list(range(75))


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_split_the_same_order(drop_last: bool) -> None:
    ranks = [ShardWindowSampler(STARTS, seed=5, num_replicas=4, rank=r, drop_last=drop_last) for r in range(4)]
    parts = [list(r) for r in ranks]
    assert len({len(p) for p in parts}) == 1
    union = sorted(i for p in parts for i in p)
    if drop_last:
        assert len(union) == 72 and len(set(union)) == 72
    else:
        assert set(union) == set(range(75)) and len(union) == 76  # padded by one, as torch pads


def test_resume_mid_epoch() -> None:
    sampler = ShardWindowSampler(STARTS, seed=9)
    sampler.set_epoch(2)
    full = list(sampler)
    resumed = ShardWindowSampler(STARTS, seed=9)
    resumed.load_state_dict({"epoch": 2, "seed": 9, "offset": 30})
    resumed.set_epoch(2)
    assert list(resumed) == full[30:]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="window"):
        ShardWindowSampler(STARTS, window=0)
    with pytest.raises(ValueError, match="rank"):
        ShardWindowSampler(STARTS, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="shard starts"):
        ShardWindowSampler([3, 5])


@pytest.mark.parametrize("replicas", [1, 2])
def test_dataloaderx_resumes_mid_epoch_with_it(tmp_path: Path, replicas: int) -> None:
    """The loader's state_dict / load_state_dict carry a ShardWindowSampler's epoch: the rest of the
    epoch after a resume is what the interrupted run would have read."""
    from fastloader import DataLoaderX
    from fastloader.datasets import TarShardDataset
    from fastloader.pack import pack
    from tests.images import write_image_folder

    write_image_folder(tmp_path / "images", count=60)
    pack(str(tmp_path / "images"), str(tmp_path / "tar"), format="tar", shard_size=12, progress=False, workers=0)
    dataset = TarShardDataset(str(tmp_path / "tar"), decode=lambda data, key: key)

    def loader() -> DataLoaderX[Any]:
        sampler = ShardWindowSampler(dataset, window=2, seed=7, num_replicas=replicas, rank=replicas - 1)
        return DataLoaderX(dataset, batch_size=4, sampler=sampler, collate_fn=lambda batch: [k for k, _ in batch])

    first = loader()
    first.set_epoch(1)
    full = list(first)
    interrupted = loader()
    interrupted.set_epoch(1)
    seen = []
    for batch in interrupted:
        seen.append(batch)
        if len(seen) == 3:
            state = interrupted.state_dict()
            break
    resumed = loader()
    resumed.load_state_dict(state)
    assert seen + list(resumed) == full
