"""How busy this process's usable cores were between two readings (psutil's per-core CPU times)."""

from __future__ import annotations

import os
from typing import Any


class CpuMeter:
    """``read()`` gives each usable core's busy share (0..1) since the previous ``read()`` (or creation)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        try:
            self.cores = sorted(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            self.cores = list(range(psutil.cpu_count() or 1))
        self._last = self._times()

    def _times(self) -> list[Any]:
        times = self._psutil.cpu_times(percpu=True)
        return [times[core] for core in self.cores if core < len(times)]

    def read(self) -> list[float]:
        """Busy share of each usable core since the last reading; empty when no time passed."""
        now = self._times()
        shares = []
        for before, after in zip(self._last, now):
            total = sum(after) - sum(before)
            idle = (after.idle + getattr(after, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
            if total > 0:
                shares.append(min(1.0, max(0.0, 1.0 - idle / total)))
        self._last = now
        return shares


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
