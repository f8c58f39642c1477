"""A pack's content digest, pinned: ``pack`` prints it, ``fastloader digest`` computes it from the records, and
``verify --expect-digest`` fails on a pack tampered with so that plain ``verify`` passes (its CRC32C or its
manifest's SHA-256 recomputed), naming the record."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fastloader.cli import main
from fastloader.formats.index_file import read_index
from fastloader.formats.tar_content import file_sha256, member_digest
from fastloader.formats.tar_index_digest import index_digest
from fastloader.formats.tar_shards import IMAGE_EXTS, INDEX_KIND, INDEX_VERSION, build_shard_index
from fastloader.pack.content_digest import RECORDS_NAME
from fastloader.pack.verify import verify
from tests.images import image_bytes, write_image_folder

OUTPUTS = ("lmdb", "tar", "parquet")


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Each format packed by the command, with the digest it printed."""
    root = tmp_path_factory.mktemp("digest")
    write_image_folder(root / "images", count=12)
    found = {}
    for output in OUTPUTS:
        dst = root / output
        capture = io.StringIO()
        from contextlib import redirect_stdout

        with redirect_stdout(capture):
            assert main(["pack", str(root / "images"), str(dst), "--format", output, "--shard-size", "4"]) == 0
        printed = [line.split()[-1] for line in capture.getvalue().splitlines() if "content digest:" in line]
        found[output] = (dst, printed[0])
    return found


def test_pack_prints_the_digest_that_digest_computes_and_verify_accepts(
    packs: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    for output in OUTPUTS:
        dst, printed = packs[output]
        assert len(printed) == 64
        assert main(["digest", str(dst)]) == 0
        assert capsys.readouterr().out.strip() == printed
        assert main(["verify", str(dst), "--no-progress", "--expect-digest", printed]) == 0
        assert capsys.readouterr().out.startswith("OK: 12 records verified")
    # The same samples make the same digest, whatever the format that holds them.
    assert len({printed for _, printed in packs.values()}) == 1


def _restamp_shard(dst: Path, number: int) -> None:
    """What a careful tamperer does after editing a shard: its index rebuilt (source keys kept, member digests
    recomputed) and the manifest's size, SHA-256 and index digest of it updated, so that plain verify passes."""
    shard = dst / f"shard-{number:06d}.tar"
    index_path = Path(f"{shard}.fl-idx")
    old = read_index(index_path, INDEX_KIND, INDEX_VERSION)
    with tarfile.open(shard) as tar:
        digests = [member_digest(info.name, tar.extractfile(info).read()) for info in tar.getmembers()]  # type: ignore[union-attr]
    extra = {name: np.array(old.arrays[name]) for name in ("source_key_blob", "source_key_offsets")}
    index_path.unlink()
    index = build_shard_index(
        str(shard), index_path, IMAGE_EXTS, {**extra, "member_digest": np.array(digests, np.uint64)}, True
    )
    manifest = dst / "fastloader-tar.json"
    raw = json.loads(manifest.read_bytes())
    raw["shards"][number].update(
        size=shard.stat().st_size, sha256=file_sha256(shard), index_sha256=index_digest(index.arrays, index.meta)
    )
    manifest.write_text(json.dumps(raw))


def test_a_tar_shard_edited_with_its_manifest_updated_fails_only_against_the_pinned_digest(
    packs: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    dst, pinned = packs["tar"]
    copy = tmp_path / "tar"
    shutil.copytree(dst, copy)
    shard = copy / "shard-000001.tar"
    with tarfile.open(shard) as tar:
        kept = [(info, tar.extractfile(info).read()) for info in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(shard, "w") as tar:
        for info, data in kept:
            if info.name == "000000006.cls":
                data = b"2"  # record 6 (class_1/0007.jpg, label 1): relabelled, and its image replaced
            if info.name == "000000006.jpg":
                data = image_bytes(6, seed=7)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _restamp_shard(copy, 1)
    assert verify(copy).ok, verify(copy).problems
    (problem,) = verify(copy, expect_digest=pinned).problems
    assert problem.startswith(f"{copy}: record 6 (key 'class_1/0007.jpg') is not the one the pinned digest vouches")
    (copy / RECORDS_NAME).unlink()  # no record digests: the difference is found, the record not named
    (problem,) = verify(copy, expect_digest=pinned).problems
    assert "not the pinned" in problem and "the record that differs is not named" in problem


def test_a_pinned_digest_that_vouches_for_no_shipped_list_still_fails(
    packs: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    dst, pinned = packs["parquet"]
    other = "0" * 64
    (problem,) = verify(dst, expect_digest=other).problems
    assert problem == (
        f"{dst}: its content digest is {pinned}, not the pinned {other}; it holds no record digests the pinned "
        "digest vouches for, so the record that differs is not named"
    )
