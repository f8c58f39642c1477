"""Memory and CPU time of a process tree from /proc: the benchmarks' one copy, importable without torch
or fastloader (bench_peers' runner imports it in another virtual environment, FFCV's).

USS is the private pages, PSS the private pages plus a share of the shared ones; PSS is split into
anonymous memory (heaps), file pages (memory-mapped data files: the page cache, counted in full by a
process that maps a file alone) and shared memory (batches handed between processes), where the
kernel reports them (``Pss_Anon`` / ``Pss_File`` / ``Pss_Shmem``, Linux 5.10+).
"""

from __future__ import annotations

import os
import statistics
import threading
import time

_FIELDS = {
    "Pss": "pss",
    "Pss_Anon": "pss_anon",
    "Pss_File": "pss_file",
    "Pss_Shmem": "pss_shmem",
    "Private_Clean": "private_clean",
    "Private_Dirty": "private_dirty",
}


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (its worker processes)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as file:
                found += [int(child) for child in file.read().split()]
        except OSError:
            continue
    return found


def memory_kb(pid: int) -> dict[str, int]:
    """USS, PSS and PSS's parts of ``pid`` in KiB (smaps_rollup); empty when the process is gone."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                if name in _FIELDS:
                    fields[_FIELDS[name]] = int(rest.split()[0])
    except OSError:
        return {}
    uss = fields.pop("private_clean", 0) + fields.pop("private_dirty", 0)
    return {"uss": uss, **fields}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) so far; 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, and so on."""
    found, todo = [], children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children(child)
    return found


def tree_cpu_seconds() -> dict[int, float]:
    """CPU seconds so far of this process and of each of its descendants, by pid."""
    me = os.getpid()
    return {pid: cpu_seconds(pid) for pid in [me, *descendants(me)]}


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: every process, in every namespace, and the
    time the hypervisor gave this machine's CPUs to others), summed over its CPUs."""
    with open("/proc/stat", encoding="ascii") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Others:
    """How many cores the rest of the machine kept busy while this process tree ran: its load, measured."""

    def __enter__(self) -> Others:
        self.started, self.busy, self.mine = time.perf_counter(), machine_busy_seconds(), tree_cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self.started
        self.cores = max(0.0, machine_busy_seconds() - self.busy - cpu_used(self.mine)) / elapsed


def cpu_used(before: dict[int, float]) -> float:
    """CPU seconds the tree used since ``before`` (``tree_cpu_seconds()``); a child started since counts
    in full, one that exited since is not seen (persistent workers do not exit)."""
    return sum(now - before.get(pid, 0.0) for pid, now in tree_cpu_seconds().items())


class PeakMemory:
    """The highest USS / PSS seen of this process and of each child (the workers), sampled every ``every`` s;
    and the highest total PSS of the tree at one instant (``tree``), with its parts at that instant."""

    def __init__(self, every: float = 0.2) -> None:
        self.every = every
        self.main: dict[str, int] = {}
        self.workers: dict[int, dict[str, int]] = {}
        self.tree: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        me = os.getpid()
        now = memory_kb(me)
        for key, value in now.items():
            self.main[key] = max(self.main.get(key, 0), value)
        total = dict(now)
        for child in children(me):
            sample = memory_kb(child)
            peak = self.workers.setdefault(child, {})
            for key, value in sample.items():
                peak[key] = max(peak.get(key, 0), value)
                total[key] = total.get(key, 0) + value
        if total.get("pss", 0) > self.tree.get("pss", 0):
            self.tree = total

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        """MB: the main process's and the mean worker's peaks, and the tree's peak total PSS with its parts."""
        uss = [peak.get("uss", 0) / 1024 for peak in self.workers.values()]
        pss = [peak.get("pss", 0) / 1024 for peak in self.workers.values()]
        return {
            "main_uss_mb": self.main.get("uss", 0) / 1024,
            "main_pss_mb": self.main.get("pss", 0) / 1024,
            "worker_uss_mb": statistics.mean(uss) if uss else 0.0,
            "worker_pss_mb": statistics.mean(pss) if pss else 0.0,
            "total_pss_mb": (self.main.get("pss", 0) + sum(peak.get("pss", 0) for peak in self.workers.values()))
            / 1024,
            "tree_pss_mb": self.tree.get("pss", 0) / 1024,
            "tree_pss_anon_mb": self.tree.get("pss_anon", 0) / 1024,
            "tree_pss_file_mb": self.tree.get("pss_file", 0) / 1024,
            "tree_pss_shmem_mb": self.tree.get("pss_shmem", 0) / 1024,
        }
