"""A pack killed by SIGKILL takes its reader processes with it: real processes, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers import ROOT, pid_alive, wait_until
from tests.images import write_image_folder


@pytest.mark.parametrize("command", ["pack", "scan"])
def test_the_readers_of_a_killed_pack_die_with_it(tmp_path: Path, command: str) -> None:
    write_image_folder(tmp_path / "src", count=200)
    markers = tmp_path / "markers"
    args = [str(tmp_path / "src"), str(tmp_path / "dst"), str(tmp_path / "gate"), str(markers), "40", "tar", "2"]
    script = "pack" if command == "pack" else "scan"
    parent = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT[script], *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        # Both readers held in a read (the gate never opens), the writer waiting on them: mid-run.
        readers = lambda: {int(name.split("-")[0]) for name in os.listdir(markers)} if markers.is_dir() else set()  # noqa: E731
        assert wait_until(lambda: len(readers()) >= 2 or parent.poll() is not None, timeout=120)
        assert parent.poll() is None, parent.communicate()
        children = psutil.Process(parent.pid).children(recursive=True)
        assert readers() <= {child.pid for child in children} and len(children) >= 2
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        # Bounded: the kernel kills them at once; 60 s leaves room for a loaded machine.
        gone = wait_until(lambda: not any(pid_alive(child.pid) for child in children), timeout=60)
        left = [child.pid for child in children if pid_alive(child.pid)]
        assert gone, f"child processes {left} of the killed pack {parent.pid} are still alive"
    finally:
        (tmp_path / "gate").touch()  # whatever is left (on failure) stops waiting
        if parent.poll() is None:
            parent.kill()
            parent.wait()


_SCRIPT = {
    "pack": "import sys; from tests.pack.gated_source import main; main(sys.argv[1:])",
    "scan": (
        "import sys\n"
        "import importlib\n"
        "scan = importlib.import_module('fastloader.pack.scan')\n"
        "from tests.pack.gated_source import GatedSource\n"
        "src, dst, gate, markers, hold, output, workers = sys.argv[1:]\n"
        "source = GatedSource(src, gate, int(hold), markers)\n"
        "scan.open_source = lambda *args, **kwargs: (source, 'folder')  # scan opens paths only\n"
        "scan.scan(src, report=dst + '.bad.tsv', workers=int(workers), progress=False)\n"
    ),
}
