"""`fastloader doctor PATH` on real packed data: the JSON validates against its schema, the report opens."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from fastloader.cli import main
from fastloader.doctor.schema import SCHEMA
from fastloader.pack import pack
from fastloader.sample import make_sample_folder
from tests.doctor.test_report_html import Page, chromium, console_messages, needs_chromium


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample_folder(tmp_path_factory.mktemp("doctor") / "photos", 40)


@pytest.mark.parametrize("packed", [None, "lmdb", "tar"], ids=["folder", "lmdb", "tar"])
def test_json_validates_against_the_schema(
    photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], packed: str | None
) -> None:
    path = photos
    if packed:
        path = tmp_path / f"photos.{packed}"
        pack(str(photos), str(path), format=packed, progress=False)
    args = [str(path), "--workers", "1", "--batch-size", "8", "--batches", "6", "--step-ms", "5", "--json"]
    assert main(["doctor", *args]) == 0
    result = json.loads(capsys.readouterr().out)
    jsonschema.validate(result, SCHEMA)
    assert result["dataset"] == {"path": str(path), "format": packed or "folder", "images": 40}
    assert result["throughput"]["batches"] == 6 and result["storage"]["sequential"]["files"] > 0
    assert result["stages"]["decode"]["per_image_ms"] > 0 and result["verdict"]["advice"] is not None


def test_the_schema_refuses_a_broken_result(photos: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(photos), "--workers", "0", "--batches", "2", "--no-storage", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    jsonschema.validate(result, SCHEMA)
    assert result["storage"] is None and result["config"]["num_workers"] == 0
    result["verdict"]["level"] = "fine"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(result, SCHEMA)


def test_text_output_names_the_verdict_and_writes_the_report(
    photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.html"
    args = [str(photos), "--workers", "auto", "--batch-size", "8", "--batches", "6", "--report", str(report)]
    assert main(["doctor", *args]) == 0
    out = capsys.readouterr().out
    assert "verdict: the loader alone delivers" in out and "decode" in out and f"report: {report}" in out
    assert "num_workers='auto' chose" in out
    assert report.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


@needs_chromium
def test_a_real_report_renders_its_charts_in_a_browser(photos: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    args = [str(photos), "--workers", "1", "--batch-size", "8", "--batches", "8", "--step-ms", "5"]
    assert main(["doctor", *args, "--report", str(report)]) == 0
    done = chromium(tmp_path, report, "--dump-dom")
    dom = Page(done.stdout)
    assert {"stages", "throughput", "queues", "cpu"} <= set(dom.charts)
    assert console_messages(done.stderr) == []


def test_a_missing_dataset_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.lmdb"
    assert main(["doctor", str(missing)]) == 1
    assert str(missing) in capsys.readouterr().err


@pytest.fixture(scope="module")
def one_bad_in_200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """199 real images and one truncated JPEG, as a crawled dataset holds them."""
    from tests.images import image_bytes, write_image_folder

    root = tmp_path_factory.mktemp("doctor-bad") / "images"
    write_image_folder(root, count=199, classes=4)
    jpeg = image_bytes(0)  # a JPEG (KINDS[0])
    (root / "class_0" / "0042_truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    return root


def test_a_bad_image_is_replaced_and_counted(one_bad_in_200: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 10 batches of 20 with shuffle: one epoch of the 200, so the bad one is met.
    args = [str(one_bad_in_200), "--workers", "1", "--batch-size", "20", "--batches", "10", "--no-storage"]
    assert main(["doctor", *args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    jsonschema.validate(result, SCHEMA)
    assert result["throughput"]["images"] == 200 and result["bad_samples"] == 1
    assert result["bad_examples"][0].startswith("class_0/0042_truncated.jpg: ")
    assert main(["doctor", *args]) == 0
    out = capsys.readouterr().out
    assert "bad samples: 1 (each replaced by the next good one" in out and "0042_truncated.jpg" in out


def test_the_storage_test_passes_over_an_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.images import write_image_folder

    root = tmp_path / "images"
    write_image_folder(root, count=8, classes=2)
    listing = tmp_path / "list.txt"
    files = sorted(root.rglob("*.jpg"))
    listing.write_text("".join(f"{path} 0\n" for path in files) + f"{tmp_path / 'gone.jpg'} 1\n")
    args = [str(listing), "--workers", "0", "--batch-size", "3", "--batches", "3", "--json"]
    assert main(["doctor", *args]) == 0
    result = json.loads(capsys.readouterr().out)
    reads = result["storage"]["sequential"]["unreadable"] + result["storage"]["random"]["unreadable"]
    assert reads == 1 and result["storage"]["random"]["files"] + result["storage"]["sequential"]["files"] == 8
    assert result["bad_samples"] == 1 and "gone.jpg" in result["bad_examples"][0]
