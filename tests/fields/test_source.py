"""Fields read from a source: what each sample carries, the missing ones left out."""

from __future__ import annotations

from fastloader.fields.source import read_fields
from tests.fields.scenes import SceneSource


def test_read_fields_leaves_missing_ones_out() -> None:
    source = SceneSource(missing=(1,))
    assert set(read_fields(source, 0)) == {"json", "score", "seg.png", "txt"}
    assert set(read_fields(source, 1)) == {"json", "score", "seg.png"}
