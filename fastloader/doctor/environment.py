"""The machine's traps for a data loader: shared memory, open files, CPU quota (``fastloader doctor``)."""

from __future__ import annotations

import os
import resource
from typing import Any

from fastloader import gil, world

OPEN_FILES_MIN = 4096  # torch passes each shared batch tensor as a file descriptor; shards keep files open


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of the shared-memory filesystem the workers hand batches through (None: none)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def environment(
    batch_bytes: int, num_workers: int, prefetch_factor: int | None
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """What the machine offers this pipeline, and the traps it sets (each with its fix)."""
    import psutil
    import torch

    gil_line = gil.gil_report()  # before the imports below: it names the module that turned the GIL back on
    cores, quota = world.cores_per_rank(), world.cgroup_cpu_quota()
    shm = shm_bytes()
    in_flight = num_workers * (prefetch_factor or 2) + 2  # batches in shared memory at once, at most
    needed = batch_bytes * in_flight if num_workers > 0 else 0
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    env = {
        "usable_cores": cores,
        "cpu_count": os.cpu_count(),
        "cgroup_quota": quota,
        "local_world_size": world.local_world_size(),
        "shm_bytes": shm,
        "shm_needed_bytes": needed,
        "open_files_limit": soft if soft != resource.RLIM_INFINITY else None,
        "memory_total_bytes": psutil.virtual_memory().total,
        "cuda": torch.cuda.is_available(),
        "gpu_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "gil": gil_line,
    }
    traps = []
    if shm is not None and needed > shm / 2:
        traps.append(
            {
                "name": "shm_too_small",
                "message": f"/dev/shm has {shm / 1e6:.0f} MB; {in_flight} batches in flight need {needed / 1e6:.0f} MB"
                " (workers die with 'bus error' when it fills: pytorch#108861)",
                "fix": "docker run --shm-size=8g (or --ipc=host), or fewer workers / a smaller prefetch_factor",
            }
        )
    if soft != resource.RLIM_INFINITY and soft < OPEN_FILES_MIN:
        traps.append(
            {
                "name": "open_files_limit",
                "message": f"the open-files limit is {soft}: workers hand batches over as file descriptors and"
                " shards keep files open ('Too many open files')",
                "fix": f"ulimit -n {OPEN_FILES_MIN * 16} before training (or raise nofile in limits.conf)",
            }
        )
    if gil.free_threaded_build() and gil.gil_enabled():
        traps.append(
            {
                "name": "gil_enabled",
                "message": f"this free-threaded Python runs with the GIL: {gil_line}",
                "fix": "a release of that module that supports free-threading, or PYTHON_GIL=0 (at your own risk)",
            }
        )
    if num_workers > cores:
        why = f"the CPU quota of {quota:g} cores" if quota is not None else f"{cores} usable cores"
        traps.append(
            {
                "name": "workers_over_cores",
                "message": f"num_workers={num_workers} but this rank has {why}"
                + (f" ({world.local_world_size()} ranks share the machine)" if world.local_world_size() > 1 else "")
                + ": the workers thrash",
                "fix": f"num_workers={max(1, cores)} (or num_workers='auto')",
            }
        )
    return env, traps
