"""benchmarks/bench_decoded_cache.py works before it meets a long run: a smoke run on a few sample images
writes the JSON the docs' figures are read from, the loader with a cache beside the one without."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fastloader.pack import pack
from fastloader.sample import make_sample_folder
from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]


def test_both_loaders_are_measured_epoch_by_epoch(tmp_path: Path) -> None:
    make_sample_folder(tmp_path / "images", 24, workers=1)
    pack(tmp_path / "images", tmp_path / "sample.lmdb", resize_max_side=256, quality=90)
    out = tmp_path / "cache.json"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_decoded_cache.py"),
        "--lmdb",
        str(tmp_path / "sample.lmdb"),
    ]
    command += ["--epochs", "2", "--repeats", "1", "--workers", "1", "--batch-size", "8", "--out", str(out)]
    done = run_child(command, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"no cache", "cache"}
    for runs in result["runs"].values():
        assert len(runs) == 1 and len(runs[0]) == 3  # the first epoch and the two after it
        assert all(epoch["images_per_s"] > 0 and epoch["us_per_image"] >= 0 for epoch in runs[0])  # CPU: 10 ms ticks
    assert set(result["summary"]["cache"]) == {"first epoch", "later epochs"}
