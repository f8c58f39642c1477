"""Names chosen by whoever made the data, shown inert: a tar member holding terminal escapes (OSC 52, a
screen clear) is printed escaped, a bad-sample list writes them escaped and reads them back whole, and the
doctor's HTML report escapes every string of its result."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from fastloader.doctor.report_html import render_report
from fastloader.formats import bad_samples
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.tar_shards import (
    build_shard_index,
)
from tests.doctor.test_report_html import ALL_CHARTS, Page, full_result, stage
from tests.formats.test_tar_shards import encode, write_tar

EVIL = '<script>alert("x")</script>&<img src=x onerror=alert(1)>'  # a name in a doctor's result


def test_the_ignored_member_warning_holds_no_terminal_escape(tmp_path: Path) -> None:
    """A member's name is the shard's to choose: OSC 52 (write the clipboard) and a screen clear in it are
    shown escaped, never sent to the terminal as they are."""
    path = tmp_path / "evil.tar"
    name = "../\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2Jx.jpg"
    write_tar(path, [(name, b"x"), ("good.jpg", encode())], tarfile.PAX_FORMAT)
    with pytest.warns(UserWarning, match="ignored 1 unsafe") as caught:
        build_shard_index(str(path), tmp_path / "evil.idx")
    message = str(caught[0].message)
    assert "\x1b" not in message and "\x07" not in message
    assert r"../\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2Jx.jpg" in message  # the name as written, escaped


def test_a_name_holding_terminal_escapes_is_written_inert_and_read_back_whole(tmp_path: Path) -> None:
    """OSC 52 (write the clipboard), a screen clear, a one-character CSI and a bidi override in a key:
    the list holds none of them raw (``cat`` shows the name), and reads back the same key."""
    sample = BadSample(5, "x\x1b]52;c;cm0gLXJm\x07\x1b[2J\x9b\u202eevil.jpg", "undecodable: \x1b[31mred")
    path = tmp_path / "bad.tsv"
    bad_samples.write(path, [sample])
    raw = path.read_bytes()
    assert not any(byte in raw for byte in (b"\x1b", b"\x07", "\x9b".encode(), "\u202e".encode()))
    assert bad_samples.read(path) == [sample]


def test_every_string_from_the_result_is_escaped() -> None:
    result = full_result()
    result["dataset"]["path"] = f"data/{EVIL}.lmdb"
    result["config"][EVIL] = EVIL
    result["traps"][0]["message"] = EVIL
    result["traps"][0]["fix"] = EVIL
    result["verdict"]["advice"] = [EVIL]
    result["verdict"]["level"] = EVIL
    result["verdict"]["bottleneck"] = EVIL
    result["stages"][EVIL] = stage(1.0, where=EVIL)
    result["storage"][EVIL] = {"mb_per_s": 1.0}
    result["environment"][EVIL] = EVIL
    result["gpu"]["name"] = EVIL
    text = render_report(result)
    assert "<script" not in text.lower() and "<img" not in text.lower()
    assert "&lt;script&gt;" in text
    assert "data/&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&lt;img" in text
    page = Page(text)
    assert set(page.charts) == ALL_CHARTS  # the hostile stage name did not break the svg apart
    assert "data/" + EVIL + ".lmdb" in " ".join(page.text)  # and a browser shows it as the text it was
