"""Every field kind through every pack output and from each into each other: names, kinds and values exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastloader.datasets.sources import open_source
from fastloader.errors import MissingField
from fastloader.fields.source import field_kinds
from fastloader.pack.engine import pack
from fastloader.pack.verify import verify
from tests.field_items import FIELDS, FieldItems, assert_same_value, field_values
from tests.images import image_bytes

OUTPUTS = ("lmdb", "tar", "parquet")
COUNT = 9


def _check(path: Path, where: str) -> None:
    source, _ = open_source(str(path))
    assert len(source) == COUNT, where
    assert field_kinds(source) == dict(sorted(FIELDS.items())), where
    for index in range(COUNT):
        assert source.read(index) == image_bytes(index), (where, index)
        assert source.label(index) == index % 3, (where, index)
        expected = field_values(index)
        for name in FIELDS:
            if name in expected:
                assert_same_value(source.read_field(index, name), expected[name], f"{where}[{index}].{name}")
            else:
                with pytest.raises(MissingField, match=repr(name)):
                    source.read_field(index, name)


@pytest.fixture(scope="module")
def first_packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("first")
    packs = {}
    for output in OUTPUTS:
        packs[output] = root / output
        summary = pack(FieldItems(COUNT), packs[output], format=output, shard_size=4, workers=0, progress=False)
        assert summary.packed == COUNT and not summary.skipped
    return packs


@pytest.mark.parametrize("output", OUTPUTS)
def test_every_kind_survives_a_pack(first_packs: dict[str, Path], output: str) -> None:
    _check(first_packs[output], output)
    report = verify(first_packs[output])
    assert report.ok, report.problems


@pytest.mark.parametrize("target", OUTPUTS)
@pytest.mark.parametrize("origin", OUTPUTS)
def test_every_kind_survives_a_pack_between_formats(
    first_packs: dict[str, Path], origin: str, target: str, tmp_path: Path
) -> None:
    second = tmp_path / f"{origin}-to-{target}"
    summary = pack(first_packs[origin], second, format=target, shard_size=5, workers=2, progress=False)
    assert summary.packed == COUNT and not summary.skipped
    _check(second, f"{origin} -> {target}")
    assert verify(second).ok
