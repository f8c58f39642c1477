"""What a user sees when a ``fastloader`` command goes wrong: the path, the flag and the usage they typed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fastloader import __version__
from fastloader.cli import build_parser, main
from fastloader.pack.engine import pack
from tests.images import write_image_folder


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """argparse's exit (status 2) and what it printed on stderr."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["pack", "photoz", "photoz.lmdb", "--no-progress"],
        ["scan", "photoz", "--no-progress"],
        ["verify", "photoz", "--no-progress"],
        ["fields", "photoz"],
        ["doctor", "photoz", "--no-progress"],
        ["bench", "photoz"],
    ],
)
def test_a_path_that_does_not_exist_is_named_as_such(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"fastloader {argv[0]}: error: photoz: the path does not exist" in err, err
    assert "cannot tell what to read" not in err


def test_a_path_of_no_known_kind_names_the_flag_as_typed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    assert main(["scan", str(model), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot tell what to read" in err and "--src-format on the command line" in err, err


def test_a_worker_count_that_is_not_a_number_is_said_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["doctor", "photos", "--workers", "two"], capsys)
    assert "argument --workers: must be a number of workers (0 or more) or auto, got 'two'" in err, err
    assert "_workers_or_auto" not in err
    err = usage_error(["pack", "a", "b", "--shard-size", "many"], capsys)
    assert "argument --shard-size: must be a positive integer, got 'many'" in err and "_positive" not in err


def test_a_mistyped_flag_shows_its_commands_usage_and_is_never_taken_as_a_prefix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = usage_error(["doctor", "photos", "--worker", "2"], capsys)  # --workers, abbreviated
    assert err.startswith("usage: fastloader doctor ") and "--no-storage" in err, err
    assert "fastloader doctor: error: unrecognized arguments: --worker 2" in err
    err = usage_error(["verify", "x.lmdb", "--bogus"], capsys)
    assert err.startswith("usage: fastloader verify ") and "fastloader verify: error: unrecognized arguments" in err


def test_no_parser_takes_abbreviations() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert not parser.allow_abbrev
    assert {name: sub.allow_abbrev for name, sub in commands.choices.items()} == dict.fromkeys(commands.choices, False)


def test_version_and_the_doctors_no_progress(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"fastloader {__version__}\n"
    assert build_parser().parse_args(["doctor", "photos", "--no-progress"]).no_progress


@pytest.fixture
def undecodable(tmp_path: Path) -> Path:
    """A folder whose only image does not decode."""
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "cat" / "a.jpg").write_bytes(b"not a JPEG at all")
    return tmp_path / "src"


def test_a_pack_that_wrote_nothing_fails_and_so_does_verifying_it(
    undecodable: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "out.lmdb"
    assert main(["pack", str(undecodable), str(dst), "--no-progress", "--workers", "0", "--max-skipped", "1"]) == 1
    captured = capsys.readouterr()
    assert "packed 0 of 1 images" in captured.out
    assert f"error: nothing was packed: all 1 items of {undecodable} were skipped" in captured.err
    assert f"(listed in {dst}.skipped.tsv)" in captured.err
    assert main(["verify", str(dst), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAILED: {dst} (lmdb) is empty: it holds no records"), out
    assert "OK" not in out


def test_a_pack_that_skipped_more_than_max_skipped_fails_naming_the_skip_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_image_folder(tmp_path / "src", count=8, classes=1)
    for name in ("zz_bad.jpg", "zz_worse.jpg"):  # 2 of 10 skipped
        (tmp_path / "src" / "class_0" / name).write_bytes(b"not a JPEG")
    dst = tmp_path / "out.lmdb"
    argv = ["pack", str(tmp_path / "src"), str(dst), "--no-progress", "--workers", "0"]
    assert main(argv) == 1  # 20% against the default 10%
    err = capsys.readouterr().err
    expected = (
        f"2 of 10 items skipped (20.0%), more than the 10.0% accepted (--max-skipped 0.1) (listed in {dst}.skipped"
    )
    assert expected in err, err
    assert main([*argv, "--max-skipped", "0.2"]) == 0  # the same pack, resumed: complete, 20% accepted
    assert main(["verify", str(dst), "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("OK: 8 records verified")


def test_fields_of_samples_without_fields_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_image_folder(tmp_path / "src", count=2, classes=1)
    pack(tmp_path / "src", tmp_path / "photos.lmdb", workers=0, progress=False)
    assert main(["fields", str(tmp_path / "photos.lmdb")]) == 0
    out = capsys.readouterr().out
    assert "photos.lmdb[0] (label 0): (no fields)" in out, out
    assert not any(line.endswith(":") for line in out.splitlines()), out
