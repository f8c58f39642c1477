"""``fastloader info`` names what is active, through the real console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import PIL

from fastloader import __version__
from fastloader.info import _ranges, collect


def test_info_report_names_every_piece() -> None:
    report = collect()
    for key in ("fastloader", "torch", "cuda", "PIL", "jpeg", "cpu count", "cpu affinity"):
        assert key in report
    assert report["fastloader"] == __version__
    assert report["PIL"].endswith(PIL.__version__)
    assert report["PIL"].split()[0] in ("Pillow", "Pillow-SIMD")
    assert report["cpu affinity"].startswith(f"{len(os.sched_getaffinity(0))} cores")


def test_console_script_prints_json() -> None:
    exe = shutil.which("fastloader", path=os.path.dirname(sys.executable))
    assert exe is not None, "the console script is installed with the package"
    out = subprocess.run([exe, "info", "--json"], check=True, capture_output=True, text=True).stdout
    assert json.loads(out)["fastloader"] == __version__


def test_cpu_ranges() -> None:
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert _ranges([3]) == "3"
