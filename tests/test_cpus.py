"""Cores per rank: affinity, cgroup quota and LOCAL_WORLD_SIZE; DataLoaderX's advice."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from fastloader import DataLoaderX, cpus

AFFINITY = len(os.sched_getaffinity(0))


def test_cgroup_quota_parsing(tmp_path: Path) -> None:
    limit = tmp_path / "cpu.max"
    limit.write_text("150000 100000\n")
    assert cpus.cgroup_cpu_quota(str(limit)) == 1.5
    assert cpus.usable_cpus(str(limit)) == min(AFFINITY, 2)  # 1.5 cores: two may run, at 75% each
    limit.write_text("max 100000\n")
    assert cpus.cgroup_cpu_quota(str(limit)) is None and cpus.usable_cpus(str(limit)) == AFFINITY
    assert cpus.cgroup_cpu_quota(str(tmp_path / "missing")) is None
    limit.write_text("garbage")
    assert cpus.cgroup_cpu_quota(str(limit)) is None


def test_cores_are_shared_between_local_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    unlimited = str(tmp_path / "none")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert cpus.local_world_size() == 1 and cpus.suggested_num_workers(unlimited) == AFFINITY
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(AFFINITY * 2))
    assert cpus.cores_per_rank(unlimited) == 1, "never below one core"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        cpus.local_world_size()


def test_dataloaderx_warns_when_workers_exceed_the_ranks_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(AFFINITY * 2))
    with pytest.warns(RuntimeWarning, match="suggested num_workers=1"):
        DataLoaderX(list(range(8)), batch_size=2, num_workers=2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        DataLoaderX(list(range(8)), batch_size=2, num_workers=min(AFFINITY, 2))
    assert not [w for w in records if "rank's share" in str(w.message)]
