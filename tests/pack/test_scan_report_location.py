"""Where ``fastloader scan`` says its list went when the user names none (the shipped links it must not
write through: tests/security/test_hostile_data.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastloader.cli import main
from fastloader.storage import default_report_path
from tests.images import write_image_folder


def test_a_clean_scan_says_where_its_empty_list_went(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "clean"
    write_image_folder(root, count=4, classes=1)
    assert main(["scan", str(root), "--workers", "0", "--no-progress"]) == 0
    report = default_report_path(root, ".bad.tsv")
    assert report.read_text().splitlines() == ["position\tkey\treason"]
    assert f"bad: 0, listed in {report}" in capsys.readouterr().out
    assert not Path(str(root) + ".bad.tsv").exists()
