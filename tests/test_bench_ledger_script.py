"""benchmarks/bench_ledger.py works before it meets a long run: a smoke run on a few sample images, the ledger
off and on, writes the JSON the docs' figure is read from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]


def test_ledger_off_and_on_with_a_ratio_and_the_parts_share(tmp_path: Path) -> None:
    out = tmp_path / "ledger.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_ledger.py"), "--images", "48", "--batch-size", "8"]
    command += ["--repeats", "1", "--workers", "1", "--data", str(tmp_path / "data"), "--out", str(out)]
    done = run_child(command, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    end = result["end_to_end"]
    assert end["images_per_s_ledger_off"] > 0 and end["images_per_s_ledger_on"] > 0
    assert end["ratio_on_over_off"] == pytest.approx(end["images_per_s_ledger_on"] / end["images_per_s_ledger_off"])
    parts = result["parts"]
    assert parts["overhead_percent"] == pytest.approx(
        100 * parts["ledger_us_per_image"] / parts["pipeline_us_per_image"]
    )
    assert 12 <= parts["ledger_bytes_per_sample"] < 20  # 12 bytes a sample and a block's few per batch of 8
