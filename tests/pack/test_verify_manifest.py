"""A tar or Parquet pack's manifest against what the pack holds: readers and ``verify`` refuse a manifest that
would serve a shard twice or whose numbers disagree, and ``verify`` counts every shard against its own index
or footer, finds data files no manifest records, and checks the samples against the source's items."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import lmdb
import pytest

from fastloader.datasets import LMDBDataset, ParquetDataset, TarShardDataset
from fastloader.errors import FormatError
from fastloader.formats import lmdb_records as records
from fastloader.formats.parquet_pack import ParquetPackState
from fastloader.formats.tar_manifest import TarPackState
from fastloader.pack import pack
from fastloader.pack.verify import verify
from tests.images import write_image_folder

# Per format: its state, its dataset, its data file names.
FORMATS = {
    "tar": (TarPackState, TarShardDataset, "shard-{:06d}.tar"),
    "parquet": (ParquetPackState, ParquetDataset, "part-{:06d}.parquet"),
}


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("manifests")
    write_image_folder(root / "images", count=30)
    found = {}
    for output in (*FORMATS, "lmdb"):
        found[output] = root / output
        pack(root / "images", found[output], format=output, shard_size=10, workers=0, progress=False)
        assert verify(found[output]).ok
    return found


def edited(packs: dict[str, Path], output: str, tmp_path: Path, **changes: Any) -> tuple[Path, Path]:
    """A copy of the pack whose manifest has ``changes``; returns (the copy, its manifest)."""
    copy = tmp_path / output
    shutil.copytree(packs[output], copy)
    manifest = copy / FORMATS[output][0].MANIFEST_NAME
    written = json.loads(manifest.read_bytes())
    recorded = ("size", "sha256", "index_sha256")  # what the pack recorded of each file (index_sha256: tar only)
    content = {entry["name"]: {key: entry[key] for key in recorded if key in entry} for entry in written["shards"]}
    if "shards" in changes:  # each file keeps the size and hash the pack recorded: only the numbers change
        changes["shards"] = [{**entry, **content[entry["name"]]} for entry in changes["shards"]]
    manifest.write_text(json.dumps({**written, **changes}))
    return copy, manifest


def shard(output: str, number: int, count: int, end: int) -> dict[str, Any]:
    return {"name": FORMATS[output][2].format(number), "count": count, "end_position": end}


@pytest.mark.parametrize("output", FORMATS)
def test_a_manifest_listing_a_shard_twice_is_refused_by_readers_and_verify(
    packs: dict[str, Path], tmp_path: Path, output: str
) -> None:
    """40 items of which 30 distinct, the numbers otherwise consistent: it was served twice."""
    shards = [shard(output, n, 10, 10 * (n + 1)) for n in range(3)] + [shard(output, 0, 10, 40)]
    copy, manifest = edited(packs, output, tmp_path, shards=shards, position=40, count=40)
    name = shards[0]["name"]
    for read in (verify, FORMATS[output][1]):
        with pytest.raises(FormatError, match=f"{manifest}: shard '{name}' is listed twice"):
            read(copy)


@pytest.mark.parametrize("output", FORMATS)
def test_a_wrong_end_position_is_refused(packs: dict[str, Path], tmp_path: Path, output: str) -> None:
    shards = [shard(output, 0, 10, 10), shard(output, 1, 10, 25), shard(output, 2, 10, 30)]
    copy, manifest = edited(packs, output, tmp_path, shards=shards)
    name = shards[1]["name"]
    with pytest.raises(FormatError, match=f"{manifest}: shard '{name}': count 10, but it covers positions 10..24"):
        verify(copy)


@pytest.mark.parametrize("output", FORMATS)
def test_each_shard_is_counted_against_its_own_index_or_footer(
    packs: dict[str, Path], tmp_path: Path, output: str
) -> None:
    """The numbers agree with each other (9 + 11 = 30) and the files hold 30 samples: only the files tell."""
    shards = [shard(output, 0, 9, 9), shard(output, 1, 11, 20), shard(output, 2, 10, 30)]
    copy, _ = edited(packs, output, tmp_path, shards=shards)
    what = "index" if output == "tar" else "footer"
    report = verify(copy)
    assert report.problems == (
        f"{copy / shards[0]['name']}: its {what} counts 10 samples, the manifest records 9",
        f"{copy / shards[1]['name']}: its {what} counts 10 samples, the manifest records 11",
    )


@pytest.mark.parametrize("output", FORMATS)
def test_a_data_file_the_manifest_does_not_record_is_reported(
    packs: dict[str, Path], tmp_path: Path, output: str
) -> None:
    copy = tmp_path / output
    shutil.copytree(packs[output], copy)
    extra = copy / FORMATS[output][2].format(3)
    shutil.copy(copy / FORMATS[output][2].format(2), extra)
    assert verify(copy).problems == (f"{extra}: a data file the manifest does not record",)


@pytest.mark.parametrize("output", FORMATS)
def test_a_manifest_that_lost_its_last_shard_is_short_of_the_source(
    packs: dict[str, Path], tmp_path: Path, output: str
) -> None:
    """Consistent in itself (20 positions, 20 samples), but the source held 30 items."""
    shards = [shard(output, 0, 10, 10), shard(output, 1, 10, 20)]
    copy, _ = edited(packs, output, tmp_path, shards=shards, position=20, count=20)
    assert verify(copy).problems == (
        f"{copy / FORMATS[output][2].format(2)}: a data file the manifest does not record",
        f"{copy}: 20 samples and 0 skipped, but the source packed held 30 items",
    )


def test_an_lmdb_whose_metadata_counts_more_items_than_its_source_is_reported(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "lmdb"
    shutil.copytree(packs["lmdb"], copy)
    with lmdb.open(str(copy)) as env, env.begin(write=True) as txn:
        meta = json.loads(txn.get(records.META_KEY))
        txn.put(records.META_KEY, json.dumps({**meta, "num_skipped": 2}).encode())
    assert len(LMDBDataset(copy)) == 30
    assert verify(copy).problems == (f"{copy}: 30 samples and 2 skipped, but the source packed held 30 items",)
