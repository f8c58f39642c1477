"""benchmarks/bench_sample_seeds.py works before it meets a long run: a smoke run on a few sample images, without
and with seed=, writes the JSON the docs' figure is read from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]


def test_without_and_with_seed_with_a_ratio_and_the_parts_share(tmp_path: Path) -> None:
    out = tmp_path / "sample_seeds.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_sample_seeds.py"), "--images", "24"]
    command += ["--batch-size", "8", "--repeats", "1", "--workers", "1", "--data", str(tmp_path / "data")]
    done = run_child([*command, "--out", str(out)], cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    for pipeline in ("fused", "user"):
        end = result["end_to_end"][pipeline]
        ratio = end["images_per_s_with_seed"] / end["images_per_s_without_seed"]
        assert end["ratio_with_over_without"] == pytest.approx(ratio)
    parts = result["parts"]
    assert parts["seed_sample_us"] > 0 and parts["generator_us"] > 0 and parts["pipeline_us_per_image"] > 0
