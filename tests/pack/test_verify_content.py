"""``verify`` reads every byte of a tar or Parquet pack against the hashes its manifest records: each corruption,
done for real on a real pack, fails naming the shard (and the member), and readers refuse a shard the manifest
does not list."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from fastloader.datasets import ParquetDataset, TarShardDataset
from fastloader.errors import FormatError
from fastloader.pack import pack
from fastloader.pack.verify import verify
from tests.images import write_image_folder

SHARDS = 3  # 12 images, 4 a shard


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("content")
    write_image_folder(root / "images", count=12)
    write_image_folder(root / "others", count=12, seed=1)  # another source, the same counts
    found = {}
    for output in ("tar", "parquet"):
        for name in ("images", "others"):
            dst = found[f"{output}-{name}"] = root / f"{output}-{name}"
            pack(root / name, dst, format=output, shard_size=4, workers=0, progress=False)
            assert verify(dst).ok
    return found


def shard(dst: Path, number: int) -> Path:
    return dst / f"shard-{number:06d}.tar"


def members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(info, tar.extractfile(info).read()) for info in tar.getmembers()]  # type: ignore[union-attr]


def member_offset(path: Path, suffix: str, nth: int = 0) -> tuple[str, int]:
    """The name and data offset of the ``nth`` member whose name ends with ``suffix``."""
    with tarfile.open(path) as tar:
        info = [info for info in tar.getmembers() if info.name.endswith(suffix)][nth]
        return info.name, info.offset_data


def poke(path: Path, offset: int, data: bytes, keep_mtime: bool = False) -> None:
    before = path.stat()
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(data)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def rewrite(
    path: Path, keep: Callable[[str], bool] = lambda name: True, extra: tuple[str, bytes] | None = None
) -> None:
    """Rewrite the tar with the members ``keep`` accepts, plus ``extra`` at the end."""
    kept = [(info, data) for info, data in members(path) if keep(info.name)]
    with tarfile.open(path, "w") as tar:
        for info, data in kept:
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            info = tarfile.TarInfo(extra[0])
            info.size = len(extra[1])
            tar.addfile(info, io.BytesIO(extra[1]))


# Each corruption: what it does to the copy; it returns the texts the report must hold. Shard 0 holds JPEGs,
# shard 1 PNGs, 4 samples each.
def flip_image_byte(dst: Path) -> list[str]:
    name, offset = member_offset(shard(dst, 0), ".jpg")
    poke(shard(dst, 0), offset + 200, b"\x5a")
    return [f"{shard(dst, 0)}: not the bytes that were packed", f"member '{name}' is not one that was packed"]


def flip_image_byte_keeping_mtime(dst: Path) -> list[str]:
    name, offset = member_offset(shard(dst, 0), ".jpg", 1)
    poke(shard(dst, 0), offset + 300, b"\xa5", keep_mtime=True)  # disk rot: size and mtime unchanged
    return [f"{shard(dst, 0)}: not the bytes that were packed", f"member '{name}' is not one that was packed"]


def break_jpeg_header(dst: Path) -> list[str]:
    name, offset = member_offset(shard(dst, 0), ".jpg")
    poke(shard(dst, 0), offset, b"\x00\x00\x00\x00")
    return [f"member '{name}' is not one that was packed"]


def append_junk_member(dst: Path) -> list[str]:
    rewrite(shard(dst, 2), extra=("junk.bin", b"\x00" * 700))
    return [f"{shard(dst, 2)}: not the bytes", f"{shard(dst, 2)}: member 'junk.bin' is not one that was packed"]


def edit_label(dst: Path) -> list[str]:
    name, offset = member_offset(shard(dst, 1), ".cls")
    label = shard(dst, 1).read_bytes()[offset : offset + 1]
    poke(shard(dst, 1), offset, b"2" if label != b"2" else b"1")
    return [f"member '{name}' is not one that was packed"]


def swap_class_names(dst: Path) -> list[str]:
    manifest = dst / "fastloader-tar.json"
    raw = json.loads(manifest.read_bytes())
    raw["classes"] = [raw["classes"][1], raw["classes"][0], *raw["classes"][2:]]
    manifest.write_text(json.dumps(raw, indent=1))
    return [f"{dst}: the pack's class names (['class_1', 'class_0', 'class_2']) are not those of the source"]


def shard_of_another_pack(dst: Path) -> list[str]:
    other = dst.parent / "tar-others"
    for suffix in ("", ".fl-idx"):  # with its own index: the shard is still not this pack's
        shutil.copy(f"{shard(other, 1)}{suffix}", f"{shard(dst, 1)}{suffix}")
    return [f"{shard(dst, 1)}: not the bytes that were packed"]


def swap_two_shards(dst: Path) -> list[str]:
    for suffix in ("", ".fl-idx"):
        os.rename(f"{shard(dst, 0)}{suffix}", f"{dst}/swap")
        os.rename(f"{shard(dst, 1)}{suffix}", f"{shard(dst, 0)}{suffix}")
        os.rename(f"{dst}/swap", f"{shard(dst, 1)}{suffix}")
    return [
        f"{shard(dst, 0)}: holds the bytes the manifest records for shard-000001.tar (files swapped or renamed)",
        f"{shard(dst, 1)}: holds the bytes the manifest records for shard-000000.tar (files swapped or renamed)",
    ]


def truncate_shard(dst: Path) -> list[str]:
    shard(dst, 1).write_bytes(shard(dst, 1).read_bytes()[:1500])
    return [f"{shard(dst, 1)}: not the bytes that were packed (truncated)", "truncated"]


def delete_shard(dst: Path) -> list[str]:
    shard(dst, 2).unlink()
    return [f"{shard(dst, 2)}: unreadable (FileNotFoundError"]


def drop_a_sample(dst: Path) -> list[str]:
    rewrite(shard(dst, 1), keep=lambda name: not name.startswith("000000005."))
    return [f"{shard(dst, 1)}: 2 of the 8 members packed are gone"]


def add_an_unrecorded_shard(dst: Path) -> list[str]:
    shutil.copy(shard(dst, 2), shard(dst, 3))
    return [f"{shard(dst, 3)}: a data file the manifest does not record"]


CORRUPTIONS = [
    flip_image_byte,
    flip_image_byte_keeping_mtime,
    break_jpeg_header,
    append_junk_member,
    edit_label,
    swap_class_names,
    shard_of_another_pack,
    swap_two_shards,
    truncate_shard,
    delete_shard,
    drop_a_sample,
    add_an_unrecorded_shard,
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=[c.__name__ for c in CORRUPTIONS])
def test_each_corruption_of_a_tar_pack_fails_verify_naming_it(
    packs: dict[str, Path], tmp_path: Path, corrupt: Callable[[Path], list[str]]
) -> None:
    copy = tmp_path / "tar-images"
    shutil.copytree(packs["tar-images"], copy)
    (tmp_path / "tar-others").symlink_to(packs["tar-others"])
    wanted = corrupt(copy)
    report = verify(copy)
    assert not report.ok
    for text in wanted:
        assert any(text in problem for problem in report.problems), (text, report.problems)


@pytest.mark.parametrize("corrupt", [flip_image_byte, shard_of_another_pack, swap_two_shards, append_junk_member])
def test_a_reader_refuses_a_shard_the_manifest_does_not_list(
    packs: dict[str, Path], tmp_path: Path, corrupt: Callable[[Path], list[str]]
) -> None:
    copy = tmp_path / "tar-images"
    shutil.copytree(packs["tar-images"], copy)
    (tmp_path / "tar-others").symlink_to(packs["tar-others"])
    assert len(TarShardDataset(copy)) == 12  # its catalog built while the pack was whole
    corrupt(copy)
    with pytest.raises(FormatError, match=r"shard-00000[012]\.tar: not the shard the pack's manifest records"):
        TarShardDataset(copy)
    assert not verify(copy).ok  # and the reader kept the pack's indexes: verify still names the members
    assert not any("holds no member digests" in line for line in verify(copy).problems)


def test_a_shard_copied_without_its_mtime_still_reads_and_verifies(packs: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "tar-images"
    shutil.copytree(packs["tar-images"], copy)
    later = shard(copy, 1).stat().st_mtime_ns + 10**9
    os.utime(shard(copy, 1), ns=(later, later))  # the same bytes
    assert len(TarShardDataset(copy)) == 12 and verify(copy).ok


def test_a_tar_pack_written_before_content_hashes_reads_but_does_not_verify_ok(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "old"
    shutil.copytree(packs["tar-images"], copy)
    manifest = copy / "fastloader-tar.json"
    raw = json.loads(manifest.read_bytes())
    for entry in raw["shards"]:
        del entry["size"], entry["sha256"]
    manifest.write_text(json.dumps({**raw, "version": 2}))
    report = verify(copy)
    assert not report.ok and report.checked == 12
    assert report.problems == (
        f"{copy}: cannot check the bytes of this tar pack: its manifest records no size and SHA-256 of its files "
        "(written by an older fastloader), so a flipped byte, an edited label or a swapped file would go unseen; "
        "pack it again to be able to verify it",
    )
    assert len(TarShardDataset(copy)) == 12


def part(dst: Path, number: int) -> Path:
    return dst / f"part-{number:06d}.parquet"


def test_parquet_label_edits_swapped_and_foreign_files_fail_verify(packs: dict[str, Path], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    copy = tmp_path / "parquet"
    shutil.copytree(packs["parquet-images"], copy)
    table = pq.read_table(part(copy, 0))
    labels = table.column("label").to_pylist()
    edited = table.set_column(table.schema.get_field_index("label"), "label", [[(labels[0] + 1) % 3, *labels[1:]]])
    pq.write_table(edited.replace_schema_metadata(table.schema.metadata), part(copy, 0), write_page_checksum=True)
    assert ParquetDataset(copy)[0][1] != labels[0]  # the edit reads back: only the hashes tell
    shutil.copy(part(packs["parquet-others"], 1), part(copy, 1))
    os.rename(part(copy, 2), copy / "swap")
    shutil.copy(part(copy, 1), part(copy, 2))
    problems = verify(copy).problems
    assert any(f"{part(copy, 0)}: not the bytes that were packed" in line for line in problems), problems
    assert any(f"{part(copy, 1)}: not the bytes that were packed" in line for line in problems), problems
    os.rename(copy / "swap", part(copy, 1))  # shards 1 and 2 now swapped
    shutil.copy(part(packs["parquet-images"], 1), part(copy, 2))
    problems = verify(copy).problems
    assert f"{part(copy, 1)}: holds the bytes the manifest records for part-000002.parquet" in problems[1], problems


def test_class_names_edited_in_an_lmdb_or_a_parquet_manifest_fail_verify(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    import lmdb

    from fastloader.formats import lmdb_records as records

    pack(packs["tar-images"], tmp_path / "lmdb", workers=0, progress=False)
    shutil.copytree(tmp_path / "lmdb", tmp_path / "edited.lmdb")
    with lmdb.open(str(tmp_path / "edited.lmdb")) as env, env.begin(write=True) as txn:
        meta = json.loads(txn.get(records.META_KEY))
        txn.put(records.META_KEY, json.dumps({**meta, "classes": meta["classes"][::-1]}).encode())
    assert verify(tmp_path / "lmdb").ok
    assert verify(tmp_path / "edited.lmdb").problems == (
        f"{tmp_path / 'edited.lmdb'}: the pack's class names (['class_2', 'class_1', 'class_0']) are not those of the "
        "source packed (edited?)",
    )
    copy = tmp_path / "parquet"
    shutil.copytree(packs["parquet-images"], copy)
    manifest = copy / "_fastloader-parquet.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_bytes()), "classes": ["x", "y", "z"]}))
    assert verify(copy).problems == (
        f"{copy}: the pack's class names (['x', 'y', 'z']) are not those of the source packed (edited?)",
    )


def test_the_verify_command_exits_1_naming_the_member(
    packs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fastloader.cli import main

    copy = tmp_path / "tar-images"
    shutil.copytree(packs["tar-images"], copy)
    assert main(["verify", str(copy), "--no-progress"]) == 0
    wanted = edit_label(copy)
    assert main(["verify", str(copy), "--no-progress"]) == 1
    assert wanted[0] in capsys.readouterr().out
