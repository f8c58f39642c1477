"""Fixtures of the pack tests: a real disk small enough to fill; packs held mid-run in their own processes."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture()
def gated_pack(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``gated_pack(src, dst, output, *ray_address)``: a pack held mid-run until ``tmp_path/gate`` exists
    (``tests.pack.gated_source.start``); whatever is left of them is let go and reaped afterwards."""
    from tests.pack.gated_source import start

    started: list[subprocess.Popen[str]] = []

    def run(src: Path, dst: Path, output: str, *ray_address: Any) -> subprocess.Popen[str]:
        started.append(start(src, dst, tmp_path, output, *ray_address))
        return started[-1]

    yield run
    (tmp_path / "gate").touch()
    for process in started:
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
