"""``fastloader bench``: both pipelines run on a tiny sample (an image folder and its LMDB); no timing
thresholds here (speed belongs to benchmarks/), only that the figures are made and reported right."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fastloader.cli import main
from fastloader.doctor.bench import RunIndices, bench
from fastloader.pack import pack
from fastloader.sample import make_sample_folder

IMAGES = 40
SMALL = {"batch_size": 8, "batches": 2, "repeats": 1, "num_workers": 1}  # 3 runs of 24 images each


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample_folder(tmp_path_factory.mktemp("bench") / "folder", IMAGES, num_classes=4, workers=2)


@pytest.fixture(scope="module")
def lmdb_pack(folder: Path) -> Path:
    dst = folder.parent / "folder.lmdb"
    pack(str(folder), str(dst), progress=False)
    return dst


def check_figures(result: dict[str, Any], runs: int, images_per_run: int) -> None:
    for name in ("stock", "fastloader"):
        row = result[name]
        assert row["images_per_s"] > 0 and row["first_batch_s"] > 0
        assert len(row["runs"]) == runs
        assert all(run["images"] == images_per_run for run in row["runs"])
    assert result["ratio"] == pytest.approx(result["fastloader"]["images_per_s"] / result["stock"]["images_per_s"])


@pytest.mark.parametrize("kind", ["folder", "lmdb"])
def test_bench_reports_both_rates_and_their_ratio(kind: str, folder: Path, lmdb_pack: Path) -> None:
    path = str(folder if kind == "folder" else lmdb_pack)
    result = bench(path, **SMALL)
    check_figures(result, runs=1, images_per_run=16)
    assert (result["dataset"], result["format"], result["images"]) == (path, kind, IMAGES)
    assert (result["pipeline"], result["shuffle"], result["num_workers"]) == ("train", True, 1)
    stock_reader = "torchvision ImageFolder" if kind == "folder" else "PIL Dataset"
    assert result["stock"]["loader"] == f"torch DataLoader + {stock_reader}"
    assert result["fastloader"]["loader"].startswith("DataLoaderX + ")


def test_eval_pipeline_and_a_dataset_smaller_than_a_run(lmdb_pack: Path) -> None:
    # 2 repeats x (1 + 3) batches of 16: each run reads the 40 images more than once, in order.
    result = bench(str(lmdb_pack), pipeline="eval", batch_size=16, batches=3, repeats=2, num_workers=0)
    check_figures(result, runs=2, images_per_run=48)
    assert (result["pipeline"], result["shuffle"]) == ("eval", False)
    assert result["epochs_per_run"] == pytest.approx(64 / IMAGES)


def test_run_indices_shuffle_each_epoch_or_continue_in_order() -> None:
    first, second = list(RunIndices(10, 25, shuffle=True, run=0)), list(RunIndices(10, 25, shuffle=True, run=1))
    assert len(first) == 25
    assert sorted(first[:10]) == sorted(first[10:20]) == list(range(10))  # epochs back to back
    assert len(set(first[20:])) == 5
    assert first != second  # each run its own order
    assert list(RunIndices(10, 4, shuffle=False, run=1)) == [4, 5, 6, 7]
    assert list(RunIndices(10, 4, shuffle=False, run=2)) == [8, 9, 0, 1]


def test_cli_prints_the_table_and_the_ratio(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", str(folder), "--batch-size", "8", "--batches", "2", "--repeats", "1", "--workers", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0
    assert lines[1].split() == ["loader", "images/s", "first", "batch"]
    assert lines[2].startswith("torch DataLoader + torchvision ImageFolder")
    assert lines[3].startswith("DataLoaderX + fastloader ImageFolder")
    assert lines[4].startswith("DataLoaderX: x") and "the images/s of torch's DataLoader (train pipeline" in lines[4]


def test_cli_json(lmdb_pack: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", str(lmdb_pack), "--json", "--pipeline", "eval", "--batch-size", "4", "--batches", "2"]
    status = main([*args, "--repeats", "1", "--workers", "0", "--step-ms", "1"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0
    for key in ("dataset", "format", "images", "batch_size", "num_workers", "pipeline", "torch", "torchvision"):
        assert key in result
    assert (result["format"], result["pipeline"], result["batch_size"], result["step_ms"]) == ("lmdb", "eval", 4, 1.0)
    check_figures(result, runs=1, images_per_run=8)


def test_cli_bad_path_exits_1_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.lmdb"
    assert main(["bench", str(missing)]) == 1
    assert str(missing) in capsys.readouterr().err


def test_bad_settings_are_refused(folder: Path) -> None:
    with pytest.raises(ValueError, match="pipeline"):
        bench(str(folder), pipeline="test")
    with pytest.raises(ValueError, match="batches"):
        bench(str(folder), batches=0)


def test_without_torchvision_a_clear_error(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` now raises ImportError
    with pytest.raises(RuntimeError, match=r"pip install fastloader\[vision\]"):
        bench(str(folder), **SMALL)


def test_a_bad_image_is_replaced_in_both_pipelines_and_counted(tmp_path: Path) -> None:
    from fastloader.doctor.bench import format_text
    from tests.images import image_bytes, write_image_folder

    root = tmp_path / "images"
    write_image_folder(root, count=199, classes=4)
    jpeg = image_bytes(0)
    (root / "class_0" / "0042_truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    # Each run reads 11 batches of 20: every one of the 200 images, the bad one too.
    result = bench(str(root), batch_size=20, batches=10, repeats=1, num_workers=1)
    check_figures(result, runs=1, images_per_run=200)
    assert result["images"] == 200 and result["bad_samples"] == 1
    assert result["bad_examples"][0].startswith("class_0/0042_truncated.jpg: ")
    assert "bad samples: 1 (each replaced by the next good one" in format_text(result)
