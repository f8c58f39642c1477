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
