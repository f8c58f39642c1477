"""What every test shares: its own fastloader cache directory.

Indexes that cannot sit beside their data, lock files and decoded caches go to ``$FASTLOADER_CACHE``;
each test gets an empty one, so no test reads another's files or writes into the real
``~/.cache/fastloader`` (subprocesses inherit the variable).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "fastloader-cache"
    monkeypatch.setenv("FASTLOADER_CACHE", str(cache))
    return cache
