"""``fastloader scan``: every image decoded, the bad ones listed by key and reason (real files, real readers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastloader.image import jpeg_ext
from fastloader.pack.scan import scan
from tests.images import cut, image_bytes, many_scans, photo, write_image_folder


@pytest.fixture()
def folder_with_bad_files(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    write_image_folder(root, count=24)
    truncated = image_bytes(0)
    (root / "class_0" / "zz_truncated.jpg").write_bytes(truncated[: len(truncated) // 2])
    (root / "class_1" / "zz_empty.jpg").write_bytes(b"")
    (root / "class_2" / "zz_text.jpg").write_text("not an image at all")
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_scan_lists_exactly_the_bad_files(folder_with_bad_files: Path, tmp_path: Path, workers: int) -> None:
    report = scan(folder_with_bad_files, report=tmp_path / "bad.tsv", workers=workers, progress=False)
    assert report.total == 27
    assert sorted(item.key for item in report.bad) == [
        "class_0/zz_truncated.jpg",
        "class_1/zz_empty.jpg",
        "class_2/zz_text.jpg",
    ]
    assert report.by_reason() == {"undecodable": 2, "empty": 1}
    lines = (tmp_path / "bad.tsv").read_text().splitlines()
    assert lines[0] == "position\tkey\treason" and len(lines) == 4
    assert "bad: 3, listed in" in report.format_text() and "undecodable" in report.format_text()


def test_a_clean_dataset_scans_clean(tmp_path: Path) -> None:
    root = tmp_path / "clean"
    write_image_folder(root, count=12)
    report = scan(root, workers=0, progress=False)
    assert report.total == 12 and report.bad == []
    assert report.report is not None and not Path(str(root) + ".bad.tsv").exists()  # in the cache: never beside
    assert Path(report.report).read_text().splitlines() == ["position\tkey\treason"]


def test_cli_prints_json(folder_with_bad_files: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastloader.cli",
            "scan",
            str(folder_with_bad_files),
            "--json",
            "--no-progress",
            "--workers",
            "0",
            "--report",
            str(tmp_path / "r.tsv"),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    data = json.loads(out)
    assert data["total"] == 27 and len(data["bad"]) == 3 and data["by_reason"]["undecodable"] == 2


def test_a_file_name_holding_a_carriage_return_excludes_only_itself(tmp_path: Path) -> None:
    """``bad\\r7.jpg`` does not decode: the list read back names its position only, not the good sample 7's."""
    from fastloader.datasets.error_policy import read_exclusions

    root = tmp_path / "images"
    write_image_folder(root, count=12, classes=1)
    (root / "class_0" / "bad\r7.jpg").write_bytes(b"not a jpeg")
    report = scan(root, report=tmp_path / "bad.tsv", workers=0, progress=False)
    assert [item.key for item in report.bad] == ["class_0/bad\r7.jpg"]
    assert read_exclusions(tmp_path / "bad.tsv") == [report.bad[0].position]


@pytest.mark.skipif(not jpeg_ext.AVAILABLE, reason="fastloader.image._jpeg not built")
@pytest.mark.parametrize("workers", [0, 2])
def test_scan_reports_what_training_refuses(tmp_path: Path, workers: int) -> None:
    """Files PIL decodes without an error but training's decoder refuses, whatever the crop: cut short and
    closed by an end marker (baseline, progressive, arithmetic-coded), and thousands of scans."""
    root = tmp_path / "images"
    write_image_folder(root, count=12)
    arithmetic = (Path(__file__).parents[1] / "image" / "data" / "arithmetic.jpg").read_bytes()
    bad = {
        "class_0/zz_cut.jpg": cut(photo(), 0.6),
        "class_1/zz_cut_progressive.jpg": cut(photo(progressive=True), 0.8),
        "class_1/zz_cut_arithmetic.jpg": cut(arithmetic, 0.6),
        "class_2/zz_many_scans.jpg": many_scans(2100),
    }
    for key, data in bad.items():
        (root / key).write_bytes(data)
    (root / "class_2" / "zz_arithmetic.jpg").write_bytes(arithmetic)  # whole: good
    report = scan(root, report=tmp_path / "bad.tsv", workers=workers, progress=False)
    assert report.total == 17
    reasons = {item.key: item.reason for item in report.bad}
    assert sorted(reasons) == sorted(bad)
    assert all(reason.startswith(f"undecodable: DecodeError: {key}") for key, reason in reasons.items())
    assert "more than 500 scans" in reasons["class_2/zz_many_scans.jpg"]
