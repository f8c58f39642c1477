"""Where this process stands in a (possibly distributed) job: its rank, local rank, world size, the ranks
on its machine, and the CPU cores it may really use. One place reads the environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` as torchrun sets them, or an initialised
``torch.distributed``), affinity and cgroup quota; every other module asks :class:`World`.

``os.cpu_count()`` counts the machine's cores; a training rank usually gets far fewer: a CPU
affinity mask (set by schedulers and ``taskset``), a cgroup quota (containers: a ``cpu.max`` of
8 cores on a 128-core host), and the other ranks of the same machine (``LOCAL_WORLD_SIZE`` under
torchrun) sharing them. Too many workers then thrash instead of helping.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

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


def env_int(name: str, default: int | None) -> int | None:
    """An integer environment variable (torchrun's), ``default`` when unset or empty; a clear ValueError
    naming the variable otherwise."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


@dataclass(frozen=True)
class World:
    """This process's place in the job, read once by :meth:`current`."""

    rank: int
    world_size: int
    local_rank: int | None  # None outside a launcher
    local_world_size: int
    usable_cores: int

    @classmethod
    def current(cls, cgroup_path: str = CGROUP_CPU_MAX) -> World:
        """An initialised ``torch.distributed`` for rank and world size, else torchrun's variables, else a
        single process."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world_size, rank = dist.get_world_size(), dist.get_rank()
        else:
            world_size, rank = env_int("WORLD_SIZE", 1) or 1, env_int("RANK", 0) or 0
        local_world_size = max(1, env_int("LOCAL_WORLD_SIZE", 1) or 1)
        return cls(rank, world_size, env_int("LOCAL_RANK", None), local_world_size, usable_cpus(cgroup_path))

    @property
    def cores_per_rank(self) -> int:
        """The usable cores divided between the ranks of this machine (at least 1)."""
        return max(1, self.usable_cores // self.local_world_size)


def local_world_size() -> int:
    """Ranks on this machine: ``LOCAL_WORLD_SIZE`` as torchrun sets it, else 1."""
    return max(1, env_int("LOCAL_WORLD_SIZE", 1) or 1)


def cores_per_rank(cgroup_path: str = CGROUP_CPU_MAX) -> int:
    """The usable cores divided between the ranks of this machine (at least 1)."""
    return max(1, usable_cpus(cgroup_path) // local_world_size())


def suggested_num_workers(cgroup_path: str = CGROUP_CPU_MAX) -> int:
    """``num_workers`` for one rank: its share of the cores. The rank's own process mostly waits on
    the GPU, so every core of its share can decode."""
    return cores_per_rank(cgroup_path)
