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
