"""``pack`` / ``scan`` with and without ``--confine``, over real links and a file list leaving its root."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastloader.cli import main
from fastloader.pack.engine import pack
from fastloader.pack.scan import scan
from tests.datasets.test_confine import make_tree, write_list
from tests.images import image_bytes, pack_contents


def test_confined_pack_packs_nothing_from_outside(tmp_path: Path) -> None:
    root, outside = make_tree(tmp_path)
    summary = pack(root, tmp_path / "out", workers=0, progress=False, confine=True)
    assert sorted(key for key, _, _ in pack_contents(tmp_path / "out")) == ["a/inside.jpg", "b/plain.jpg"]
    assert {data for _, _, data in pack_contents(tmp_path / "out")} == {image_bytes(0)}
    refused = {item.key: item.reason for item in summary.skipped}
    assert set(refused) == {"a/leak.jpg", "c/x.jpg"}
    expected = f"OutsideRoot: a/leak.jpg: points outside the root {root}/ (to {outside / 'secret.jpg'})"
    assert expected in refused["a/leak.jpg"]
    assert summary.outside == 0


def test_unconfined_pack_packs_them_and_says_so(tmp_path: Path) -> None:
    root, outside = make_tree(tmp_path)
    summary = pack(root, tmp_path / "out", workers=0, progress=False)
    assert len(pack_contents(tmp_path / "out")) == 4 and not summary.skipped
    assert summary.outside == 2
    text = summary.format_text()
    assert f"read 2 samples from outside the source's root, e.g. a/leak.jpg -> {outside / 'secret.jpg'}" in text


def test_pack_command_confines_a_file_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing, absolute = write_list(tmp_path)
    argv = ["pack", str(listing), str(tmp_path / "out"), "--workers", "0", "--no-progress", "--max-skipped", "1"]
    assert main([*argv, "--confine"]) == 0
    assert [key for key, _, _ in pack_contents(tmp_path / "out")] == ["in.jpg"]
    skipped = (tmp_path / "out.skipped.tsv").read_text()
    assert "../secret.jpg" in skipped and str(tmp_path / "secret.jpg") in skipped and str(absolute) in skipped
    assert "from outside" not in capsys.readouterr().out
    assert main([*argv[:2], str(tmp_path / "open"), *argv[3:]]) == 0
    assert len(pack_contents(tmp_path / "open")) == 3
    expected = f"read 2 samples from outside the source's root, e.g. ../secret.jpg -> {tmp_path / 'secret.jpg'}"
    assert expected in capsys.readouterr().out


def test_scan_counts_or_refuses_what_lies_outside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, outside = make_tree(tmp_path)
    report = scan(root, report=tmp_path / "bad.tsv", workers=0, progress=False)
    assert not report.bad and report.outside == 2
    assert f"read 2 samples from outside the source's root, e.g. a/leak.jpg -> {outside / 'secret.jpg'}" in (
        report.format_text()
    )
    argv = ["scan", str(root), "--report", str(tmp_path / "bad2.tsv"), "--workers", "0", "--no-progress", "--confine"]
    assert main(argv) == 0
    assert "bad: 2" in capsys.readouterr().out
    bad = (tmp_path / "bad2.tsv").read_text()
    assert "a/leak.jpg" in bad and "c/x.jpg" in bad and str(outside / "classdir" / "x.jpg") in bad
