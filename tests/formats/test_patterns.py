"""Shard patterns: braces and globs, and clear errors for names that match nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastloader.formats.patterns import expand_braces, expand_pattern


def test_brace_ranges_keep_zero_padding_and_order() -> None:
    assert expand_braces("s-{0008..0011}.tar") == ["s-0008.tar", "s-0009.tar", "s-0010.tar", "s-0011.tar"]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ValueError, match="empty brace range"):
        expand_braces("{5..1}")


def test_expand_pattern_globs_and_missing_files(tmp_path: Path) -> None:
    for name in ("t-0.rec", "t-1.rec", "t-2.rec"):
        (tmp_path / name).write_bytes(b"")
    assert expand_pattern(str(tmp_path / "t-*.rec")) == [str(tmp_path / f"t-{i}.rec") for i in range(3)]
    assert expand_pattern(str(tmp_path / "t-{0..1}.rec")) == [str(tmp_path / f"t-{i}.rec") for i in range(2)]
    with pytest.raises(FileNotFoundError, match="t-4.rec"):
        expand_pattern(str(tmp_path / "t-{4..5}.rec"))
    with pytest.raises(FileNotFoundError, match="no file matches"):
        expand_pattern(str(tmp_path / "*.tfrecord"))
