"""The bad-sample list: one format for pack's skipped list, scan's report and the quarantine file."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastloader.datasets.error_policy import ErrorPolicy, read_exclusions
from fastloader.formats import bad_samples
from fastloader.formats.bad_samples import BadSample

ODD = [
    BadSample(3, "cat/plain.jpg", "undecodable: OSError: broken data stream"),
    BadSample(17, "dog/a\tb.jpg", "unreadable: line one\nline two"),
    BadSample(40, "c:\\windows\\style\\name.jpg", "trailing backslash \\"),
    BadSample(41, "caf\udce9.jpg", "a name that is not UTF-8 (surrogateescape)"),
]


def test_keys_and_reasons_round_trip_whatever_they_hold(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    bad_samples.write(path, ODD)
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    assert text.startswith(bad_samples.HEADER + "\n") and text.count("\n") == len(ODD) + 1  # one line each
    assert bad_samples.read(path) == ODD
    assert read_exclusions(path) == [3, 17, 40, 41]


def test_the_quarantine_file_is_the_same_format(tmp_path: Path) -> None:
    policy = ErrorPolicy("replace", 100, None, tmp_path / "quarantine.tsv", ())
    for sample in ODD:
        policy.record(sample.position, sample.key, sample.reason)
    assert policy.bad_samples() == ODD
    assert read_exclusions(tmp_path / "quarantine.tsv") == [3, 17, 40, 41]


def test_a_malformed_line_is_named_or_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text("3\tok.jpg\tfine\nnot a position\tx\n")
    with pytest.raises(ValueError, match="bad.tsv:2"):
        bad_samples.read(path)
    assert bad_samples.read(path, strict=False) == [BadSample(3, "ok.jpg", "fine")]


# Every character str.splitlines() ends a line at (text-mode files end lines at \r and \n too), and the two
# escapes' own characters: a key or reason holding any of them must stay on its one line.
LINE_BREAKERS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\t", "\\"]


@pytest.mark.parametrize("char", LINE_BREAKERS, ids=[repr(c) for c in LINE_BREAKERS])
def test_no_character_of_a_key_or_reason_splits_its_line(tmp_path: Path, char: str) -> None:
    samples = [
        BadSample(3, f"bad{char}7", f"undecodable{char}line two"),
        BadSample(7, "good7.jpg", "fine"),
        BadSample(9, f"{char}lead and trail{char}", char),
    ]
    path = tmp_path / "bad.tsv"
    bad_samples.write(path, samples)
    data = path.read_bytes().decode("utf-8")
    assert len(data.splitlines()) == len(samples) + 1  # whatever splits lines, one line a sample
    with open(path, encoding="utf-8") as text_mode:  # universal newlines, as a user's script reads it
        assert len(text_mode.readlines()) == len(samples) + 1
    assert bad_samples.read(path) == samples
    assert read_exclusions(path) == [3, 7, 9]


def test_the_quarantine_keeps_odd_keys_on_one_line(tmp_path: Path) -> None:
    policy = ErrorPolicy("replace", 100, None, tmp_path / "q.tsv", ())
    policy.record(3, "bad\r7", "OSError: broken\u2028data")
    policy.record(5, "x\x85y", "z")
    assert read_exclusions(tmp_path / "q.tsv") == [3, 5]
    assert [sample.key for sample in policy.bad_samples()] == ["bad\r7", "x\x85y"]


def test_lists_written_by_older_versions_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.tsv"
    # Escaped as before (\\, \t, \n only), with a raw \x0c an older version left unescaped.
    path.write_bytes(b"position\tkey\treason\n3\tdog/a\\tb.jpg\tline one\\nline two\n40\tc:\\\\x.jpg\tform\x0cfeed\n")
    assert bad_samples.read(path) == [
        BadSample(3, "dog/a\tb.jpg", "line one\nline two"),
        BadSample(40, "c:\\x.jpg", "form\x0cfeed"),
    ]
