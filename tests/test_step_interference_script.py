"""benchmarks/bench_step_interference.py works before it meets a long run: a smoke run of its trials
(each in its own process; the separate-process control with its feeder) writes the JSON the docs'
table is read from, with the images/s both loaders were held at."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fastloader.sample import make_sample_folder
from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_holds_the_rate_and_reports_ratios_against_the_step_alone(tmp_path: Path) -> None:
    folder = make_sample_folder(tmp_path / "images", 24)
    out = tmp_path / "step.json"
    conditions = ["alone", "torch", "dataloaderx", "dataloaderx separate"]
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_step_interference.py"), "--folder", str(folder)]
    command += ["--batch-size", "4", "--rate", "16", "--seconds", "1", "--settle", "0.5", "--repeats", "1"]
    command += ["--steps", "launch", "--conditions", *conditions, "--out", str(out)]
    done = run_child(command, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    table = result["results"]["launch"]
    assert list(table) == conditions
    assert table["alone"]["batches"] == 0 and table["alone"]["achieved_images_per_s"] == 0
    for name in conditions[1:]:
        row = table[name]
        assert row["x_alone"] > 0 and row["step_ms"] > 0 and row["alone_step_ms"] > 0
        assert 0 < row["achieved_images_per_s"] <= 2 * 16  # held near the rate: no loader ran flat out
    trial = result["runs"]["launch"]["dataloaderx separate"][0]
    assert trial["batches"] == 0 and trial["feeder"]["batches"] > 0  # the loop itself took none
    assert len(trial["loadavg"]) == 3
