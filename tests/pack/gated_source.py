"""A source that holds a pack mid-run until the test lets it go, and the script that runs such a pack.

``GatedSource`` reads positions below ``hold_from`` at once; a read of any later position first leaves a
marker ``<markers>/<pid>-<position>`` (so the test knows which process reads what), then waits until the
file ``gate`` exists (at most ``timeout`` seconds from the first wait of the process, so that a process
left behind by a failing test ends by itself). Picklable: reader processes and Ray tasks get it as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fastloader.datasets.folder import FolderSource
from tests.helpers import ROOT, wait_until
from tests.pack.wrapped_source import WrappedSource

_deadline = 0.0  # when this process stops waiting for the gate


class GatedSource(WrappedSource):
    def __init__(self, root: str, gate: str, hold_from: int, markers: str, timeout: float = 120.0) -> None:
        super().__init__(FolderSource(root))
        self.gate, self.hold_from, self.markers, self.timeout = gate, hold_from, markers, timeout

    def path(self, index: int) -> str:  # the folder's files: a resume without the gate sees the same items
        return str(self.inner.path(index))

    def read(self, index: int) -> bytes:
        if index >= self.hold_from:
            os.makedirs(self.markers, exist_ok=True)
            open(os.path.join(self.markers, f"{os.getpid()}-{index}"), "w").close()
            global _deadline
            _deadline = _deadline or time.monotonic() + self.timeout  # one wait a process, not one a read
            while not os.path.exists(self.gate) and time.monotonic() < _deadline:
                time.sleep(0.02)
        return super().read(index)


def start(src: Path, dst: Path, tmp: Path, output: str, *ray_address: str) -> subprocess.Popen[str]:
    """A real pack of ``src`` into ``dst`` in its own process (``main``), held after 5 samples until
    ``tmp/gate`` exists; with ``ray_address``, on that Ray cluster (shards of 4)."""
    args = [str(src), str(dst), str(tmp / "gate"), str(tmp / "markers"), "5", output, "0", *ray_address]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.pack.gated_source", *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def wait_for_lock(dst: Path, tmp: Path, process: subprocess.Popen[str]) -> dict[str, Any]:
    """The lock record of ``dst`` once it names ``process`` and one of its reads is held (``tmp/markers``)."""
    from fastloader.pack.dest_lock import lock_path

    path, markers = lock_path(dst), tmp / "markers"

    def recorded() -> bool:
        try:
            held = json.loads(path.read_text()).get("pid") == process.pid
        except (OSError, ValueError):
            return False
        return held and markers.is_dir() and any(markers.iterdir())

    assert wait_until(lambda: recorded() or process.poll() is not None, timeout=120), "the pack never locked"
    assert process.poll() is None, process.communicate()
    return dict(json.loads(path.read_text()))


def main(argv: list[str]) -> None:
    """``python -m tests.pack.gated_source SRC DST GATE MARKERS HOLD_FROM FORMAT WORKERS [RAY_ADDRESS]``."""
    from fastloader.pack import pack

    src, dst, gate, markers, hold_from, output, workers = argv[:7]
    source = GatedSource(src, gate, int(hold_from), markers)
    if len(argv) > 7:  # the Ray engine
        pack(source, dst, format=output, engine="ray", ray_address=argv[7], shard_size=4, progress=False)
    else:
        pack(source, dst, format=output, workers=int(workers), shard_size=8, progress=False)


if __name__ == "__main__":
    main(sys.argv[1:])
