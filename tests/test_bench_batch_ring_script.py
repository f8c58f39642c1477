"""benchmarks/bench_batch_ring.py works before it meets a long run: a smoke run on a few sample images, the
ring off and on, each in a fresh interpreter, writes the JSON the docs' figures are read from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]


def test_ring_off_and_on_with_their_counts_and_a_paired_ratio(tmp_path: Path) -> None:
    out = tmp_path / "ring.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_batch_ring.py"), "--images", "200"]
    command += ["--batch-size", "8", "--repeats", "1", "--warmup", "1", "--epochs", "1", "--packs", "256"]
    command += ["--pipelines", "eval", "--data", str(tmp_path / "data"), "--out", str(out)]
    done = run_child(command, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())["256/eval"]
    off, on = figures["runs"]["off"][0], figures["runs"]["on"][0]
    assert off["batch_ring"] is None  # switched off: no ring made
    assert on["batch_ring"]["reused"] >= 25 * 2 and on["batch_ring"]["fresh"] == 0  # 25 batches an epoch, 2 epochs
    for run in (off, on):
        assert run["images_per_s"] > 0 and run["us_per_image"] > 0
    assert figures["on_vs_off"] == pytest.approx(on["images_per_s"] / off["images_per_s"])
