"""benchmarks/bench_peers.py works before it meets a long run: a smoke run of a few sample images, every
loader in its own process, writes the JSON the docs' table is read from; every batch is checked."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def run_peers(tmp_path: Path, rows: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = tmp_path / "peers.json"
    command = [sys.executable, str(BENCHMARKS / "bench_peers.py"), "--images", "96", "--batch-size", "8"]
    command += ["--workers", "1", "--repeats", "1", "--epochs", "1", "--pipelines", "train", "eval"]
    command += ["--data", str(tmp_path / "data"), "--out", str(out), "--rows", *rows]
    done = run_child(command, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(json.loads(out.read_text()))


def check_row(row: dict[str, Any]) -> None:
    assert row["runs"] == 1 and row["failed"] == 0, row["errors"]
    assert row["images_per_s"] > 0 and row["images_per_cpu_s"] > 0 and row["first_batch_s"] > 0
    assert row["memory_mb"]["tree_pss_mb"] > 0
    assert row["batch"]["dtype"] == "torch.uint8" and row["batch"]["shape"][1:] == [3, 224, 224]
    assert 20 < row["batch"]["mean_pixel"] < 235  # photographs, not a zeroed or saturated buffer


def test_torchvision_and_fastloader_rows_with_ratios_and_ceilings(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("FFCV_PYTHON", None)  # no FFCV rows here: the next test has them
    rows = ["torchvision (project's Pillow)", "fastloader LMDB", "fastloader LMDB-256", "FFCV"]
    result = run_peers(tmp_path, rows, env)
    assert result["skipped"] == ["FFCV"]
    assert len(result["loadavg"]["before"]) == 3
    for pipeline in ("train", "eval"):
        table = result["results"][pipeline]
        for name in rows[:3]:
            check_row(table[name])
        ours, top = table["fastloader LMDB"], table["ceiling full"]
        for key in ("images_per_s", "images_per_cpu_s"):
            assert ours[f"{key}_best_peer"] == "torchvision (project's Pillow)"
            assert ours[f"{key}_x_best_peer"] == pytest.approx(ours[key] / table[ours[f"{key}_best_peer"]][key])
            assert f"{key}_best_peer" not in table["fastloader LMDB-256"]  # no 256-px peer ran
        assert top["images_per_s"] == pytest.approx(top["single_thread_images_per_s"])  # 1 worker: 1 core
        assert ours["images_per_s_of_ceiling"] == pytest.approx(ours["images_per_s"] / top["images_per_s"])
        cpu = ours["images_per_cpu_s"] / top["single_thread_images_per_cpu_s"]
        assert ours["images_per_cpu_s_of_ceiling"] == pytest.approx(cpu)


@pytest.mark.skipif(not os.environ.get("FFCV_PYTHON"), reason="FFCV_PYTHON: a Python with ffcv installed")
def test_ffcv_rows_write_betons_and_give_checked_uint8_batches(tmp_path: Path) -> None:
    result = run_peers(tmp_path, ["FFCV", "FFCV-256", "fastloader LMDB-256"], dict(os.environ))
    for pipeline in ("train", "eval"):
        table = result["results"][pipeline]
        for name in ("FFCV", "FFCV-256"):
            check_row(table[name])
            assert table[name]["versions"]["ffcv"]
        assert table["fastloader LMDB-256"]["images_per_s_best_peer"] == "FFCV-256"
    assert {"beton", "beton-256"} <= set(result["bytes_per_image"])  # (page-padded: no size order at 96 images)


def test_the_runner_refuses_batches_of_another_shape_or_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import peers_runner

    peers_runner.check(torch.zeros(8, 3, 224, 224, dtype=torch.uint8), 8)
    with pytest.raises(RuntimeError, match="uint8"):
        peers_runner.check(torch.zeros(8, 3, 224, 224), 8)
    with pytest.raises(RuntimeError, match=r"got \(8, 224, 224, 3\)"):
        peers_runner.check(torch.zeros(8, 224, 224, 3, dtype=torch.uint8), 8)
    with pytest.raises(RuntimeError, match="N <= 4"):
        peers_runner.check(torch.zeros(8, 3, 224, 224, dtype=torch.uint8), 4)
