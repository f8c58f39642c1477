"""benchmarks/bench_decode_threads.py works before it meets a long run: a smoke run on a few sample images,
each setup in a fresh interpreter, writes the JSON the docs' figures are read from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]


def test_each_setup_is_measured_with_a_paired_ratio(tmp_path: Path) -> None:
    out = tmp_path / "threads.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_decode_threads.py"), "--images", "40"]
    command += ["--batch-size", "8", "--repeats", "1", "--warmup", "1", "--epochs", "1", "--packs", "256"]
    command += ["--pipelines", "eval", "--data", str(tmp_path / "data"), "--out", str(out)]
    done = run_child(command, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())["256/eval"]
    assert set(figures["runs"]) == {"1 worker, 1 thread", "1 worker, 2 threads", "2 workers, 1 thread"}
    for runs in figures["runs"].values():
        assert runs[0]["images_per_s"] > 0 and runs[0]["us_per_image"] > 0
    one, two = figures["runs"]["1 worker, 1 thread"][0], figures["runs"]["1 worker, 2 threads"][0]
    assert figures["two_threads_vs_one"] == pytest.approx(two["images_per_s"] / one["images_per_s"])
