"""How many CPU cores this process may really use, and how many workers each rank should start.

``os.cpu_count()`` counts the machine's cores; a training rank usually gets far fewer: a CPU
affinity mask (set by schedulers and ``taskset``), a cgroup quota (containers: a ``cpu.max`` of
8 cores on a 128-core host), and the other ranks of the same machine (``LOCAL_WORLD_SIZE`` under
torchrun) sharing them. Too many workers then thrash instead of helping.
"""

from __future__ import annotations

import math
import os

CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def cgroup_cpu_quota(path: str = CGROUP_CPU_MAX) -> float | None:
    """Cores allowed by a cgroup v2 ``cpu.max`` limit, or None when unlimited or unknown."""
    try:
        with open(path, encoding="ascii") as file:
            quota, period = file.read().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def usable_cpus(cgroup_path: str = CGROUP_CPU_MAX) -> int:
    """Cores this process may run on: its affinity mask, capped by the cgroup quota (rounded up)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_path)
    return max(1, min(count, math.ceil(quota)) if quota is not None else count)


def local_world_size() -> int:
    """Ranks on this machine: ``LOCAL_WORLD_SIZE`` as torchrun sets it, else 1."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    try:
        return max(1, int(value)) if value else 1
    except ValueError:
        raise ValueError(f"environment variable LOCAL_WORLD_SIZE={value!r} is not an integer") from None


def cores_per_rank(cgroup_path: str = CGROUP_CPU_MAX) -> int:
    """The usable cores divided between the ranks of this machine (at least 1)."""
    return max(1, usable_cpus(cgroup_path) // local_world_size())


def suggested_num_workers(cgroup_path: str = CGROUP_CPU_MAX) -> int:
    """``num_workers`` for one rank: its share of the cores. The rank's own process mostly waits on
    the GPU, so every core of its share can decode."""
    return cores_per_rank(cgroup_path)
