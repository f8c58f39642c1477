"""Where ``fastloader scan`` puts its list when the user names none: in the user's cache, never in the
dataset's directory, and never through a symbolic link (real links, a real dataset of real files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastloader.cli import main
from fastloader.storage import default_report_path
from tests.images import write_image_folder

HOSTILE_NAME = "$(touch${IFS}PWNED).jpg"  # a file name of the dataset's choosing, written into the report


def _shipped_dataset(tmp_path: Path) -> tuple[Path, Path]:
    """A dataset a stranger shipped: a folder and a file list of it, one image named to run a command, and
    a link beside each source waiting for the default report, pointing at the user's ``.bashrc``."""
    dataset = tmp_path / "dataset"
    write_image_folder(dataset / "train", count=4, classes=1)
    (dataset / "train" / "class_0" / HOSTILE_NAME).write_bytes(b"not an image")
    names = sorted(path.name for path in (dataset / "train" / "class_0").iterdir())
    (dataset / "train.txt").write_text("".join(f"train/class_0/{name} 0\n" for name in names))
    bashrc = tmp_path / "victim" / ".bashrc"
    bashrc.parent.mkdir()
    bashrc.write_text("export PATH=$HOME/bin:$PATH\n")
    for source in ("train", "train.txt"):
        (dataset / f"{source}.bad.tsv").symlink_to(Path("..") / "victim" / ".bashrc")
    return dataset, bashrc


@pytest.mark.parametrize("source", ["train", "train.txt"])
def test_the_default_report_goes_to_the_cache_and_the_planted_link_is_untouched(
    tmp_path: Path, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset, bashrc = _shipped_dataset(tmp_path)
    assert main(["scan", str(dataset / source), "--workers", "0", "--no-progress"]) == 0
    assert bashrc.read_text() == "export PATH=$HOME/bin:$PATH\n"
    assert (dataset / f"{source}.bad.tsv").is_symlink()
    report = default_report_path(dataset / source, ".bad.tsv")
    assert report.is_relative_to(tmp_path / "fastloader-cache")  # the test's own $FASTLOADER_CACHE
    assert HOSTILE_NAME in report.read_text()
    assert f"listed in {report}" in capsys.readouterr().out  # the user is told where it went


def test_a_link_at_the_default_location_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset, bashrc = _shipped_dataset(tmp_path)
    report = default_report_path(dataset / "train", ".bad.tsv")
    report.parent.mkdir(parents=True)
    report.symlink_to(bashrc)
    assert main(["scan", str(dataset / "train"), "--workers", "0", "--no-progress"]) != 0
    assert "a symbolic link where fastloader writes a report by default: not followed" in capsys.readouterr().err
    assert bashrc.read_text() == "export PATH=$HOME/bin:$PATH\n" and report.is_symlink()


def test_a_clean_scan_says_where_its_empty_list_went(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "clean"
    write_image_folder(root, count=4, classes=1)
    assert main(["scan", str(root), "--workers", "0", "--no-progress"]) == 0
    report = default_report_path(root, ".bad.tsv")
    assert report.read_text().splitlines() == ["position\tkey\treason"]
    assert f"bad: 0, listed in {report}" in capsys.readouterr().out
    assert not Path(str(root) + ".bad.tsv").exists()
