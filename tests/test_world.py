"""World: rank, local rank and world size from torchrun's variables; cores per rank (affinity, cgroup quota,
LOCAL_WORLD_SIZE); DataLoaderX's advice."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from fastloader import DataLoaderX, world
from fastloader.world import World

AFFINITY = len(os.sched_getaffinity(0))


def test_cgroup_quota_parsing(tmp_path: Path) -> None:
    limit = tmp_path / "cpu.max"
    limit.write_text("150000 100000\n")
    assert world.cgroup_cpu_quota(str(limit)) == 1.5
    assert world.usable_cpus(str(limit)) == min(AFFINITY, 2)  # 1.5 cores: two may run, at 75% each
    limit.write_text("max 100000\n")
    assert world.cgroup_cpu_quota(str(limit)) is None and world.usable_cpus(str(limit)) == AFFINITY
    assert world.cgroup_cpu_quota(str(tmp_path / "missing")) is None
    limit.write_text("garbage")
    assert world.cgroup_cpu_quota(str(limit)) is None


def test_cores_are_shared_between_local_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    unlimited = str(tmp_path / "none")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert world.local_world_size() == 1 and world.suggested_num_workers(unlimited) == AFFINITY
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(AFFINITY * 2))
    assert world.cores_per_rank(unlimited) == 1, "never below one core"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        world.local_world_size()


def test_dataloaderx_warns_when_workers_exceed_the_ranks_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(AFFINITY * 2))
    with pytest.warns(RuntimeWarning, match="suggested num_workers=1"):
        DataLoaderX(list(range(8)), batch_size=2, num_workers=2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        DataLoaderX(list(range(8)), batch_size=2, num_workers=min(AFFINITY, 2))
    assert not [w for w in records if "rank's share" in str(w.message)]


def test_world_reads_torchruns_variables_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    current = World.current()
    assert (current.rank, current.world_size, current.local_rank, current.local_world_size) == (5, 8, 1, 4)
    assert current.cores_per_rank == max(1, current.usable_cores // 4)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name)
    alone = World.current()
    assert (alone.rank, alone.world_size, alone.local_rank, alone.local_world_size) == (0, 1, None, 1)
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero'"):
        World.current()
