"""A pack killed after some shards resumes only over the very items it began with: a replaced or moved image
is refused by name, never kept with its old bytes or label."""

from __future__ import annotations

import io
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastloader.errors import FormatError
from fastloader.formats.tar_manifest import TarPackState
from fastloader.pack import pack
from fastloader.pack.shard_sink import ShardedSink
from tests.images import image_bytes, write_image_folder


def pack_killed_after(src: Path, dst: Path, shards: int, shard_size: int) -> None:
    """Run the pack in a forked child that SIGKILLs itself once ``shards`` shards are recorded."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest teardown, no atexit, a real SIGKILL
        try:
            record = ShardedSink._record

            def record_then_die(self, recorded, position):  # type: ignore[no-untyped-def]
                record(self, recorded, position)
                if len(recorded) >= shards:
                    os.kill(os.getpid(), signal.SIGKILL)

            ShardedSink._record = record_then_die  # type: ignore[method-assign]
            pack(src, dst, format="tar", shard_size=shard_size, workers=0, progress=False)
        finally:
            os._exit(3)  # only reached when the kill did not happen
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert len(TarPackState.read(dst / TarPackState.PROGRESS_NAME).shards) == shards


def other_image(size: int, seed: int) -> bytes:
    """A different real JPEG of exactly ``size`` bytes (padded after its end marker, as decoders allow)."""
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(out, "JPEG")
    data = out.getvalue()
    assert len(data) <= size
    return data + b"\x00" * (size - len(data))


@pytest.mark.parametrize("same_size", [True, False], ids=["same-size", "other-size"])
def test_an_image_replaced_after_a_kill_is_refused_by_name(tmp_path: Path, same_size: bool) -> None:
    items = write_image_folder(tmp_path / "images", count=12, classes=2)
    dst = tmp_path / "shards"
    pack_killed_after(tmp_path / "images", dst, shards=1, shard_size=4)
    key, _, old = items[1]  # in the durable first shard: a resume would not read it again
    path = tmp_path / "images" / key
    stat = path.stat()
    path.write_bytes(other_image(len(old), 7) if same_size else image_bytes(99))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000))  # a replacement always has another mtime
    with pytest.raises(FormatError, match=rf"source item 1 \({key}\) changed since this pack began.*delete"):
        pack(tmp_path / "images", dst, format="tar", shard_size=4, workers=0, progress=False)
    assert not (dst / TarPackState.MANIFEST_NAME).exists()  # nothing finished over the old bytes


def test_an_image_moved_to_another_class_outside_the_sampled_names_is_refused(tmp_path: Path) -> None:
    # 1,200 images: more than the 1,000 names a fingerprint used to sample. The last image of class "a" moves
    # to class "b" under a name that sorts first there: it keeps its position, only its key and label change.
    root, total, in_a = tmp_path / "images", 1200, 298
    sampled = {round(i * (total - 1) / 999) for i in range(1000)}
    assert in_a - 1 not in sampled  # a position the old fingerprint never looked at
    data = other_image(800, 1)
    for label, count in (("a", in_a), ("b", total - in_a)):
        (root / label).mkdir(parents=True)
        for i in range(count):
            (root / label / f"{label}{i:04d}.jpg").write_bytes(data)
    dst = tmp_path / "shards"
    pack_killed_after(root, dst, shards=1, shard_size=400)
    moved = f"a/a{in_a - 1:04d}.jpg"
    os.rename(root / moved, root / "b" / "a0000.jpg")
    with pytest.raises(FormatError, match=rf"source item {in_a - 1} \(b/a0000.jpg\) changed since this pack began"):
        pack(root, dst, format="tar", shard_size=400, workers=0, progress=False)


def test_an_unchanged_source_resumes_and_packs_every_item_once(tmp_path: Path) -> None:
    items = write_image_folder(tmp_path / "images", count=12, classes=2)
    dst = tmp_path / "shards"
    pack_killed_after(tmp_path / "images", dst, shards=2, shard_size=4)
    summary = pack(tmp_path / "images", dst, format="tar", shard_size=4, workers=0, progress=False)
    assert summary.resumed_from == 8
    from tests.images import pack_contents

    assert pack_contents(dst) == [(key, label, data) for key, label, data in items]


@pytest.mark.parametrize("how", ["in-place", "cp-p", "renamed-over"])
def test_an_image_replaced_with_its_size_and_mtime_kept_is_refused_by_name(tmp_path: Path, how: str) -> None:
    """The replacement has the old image's size and mtime to the nanosecond (``os.utime``, ``cp -p`` of a file
    dated back, or one written beside, dated back and renamed over): its ctime (or inode) tells it."""
    items = write_image_folder(tmp_path / "images", count=12, classes=2)
    dst = tmp_path / "shards"
    pack_killed_after(tmp_path / "images", dst, shards=1, shard_size=4)
    key, _, old = items[1]  # in the durable first shard: a resume would not read it again
    path = tmp_path / "images" / key
    before = path.stat()
    new = other_image(len(old), 7)
    if how == "in-place":
        path.write_bytes(new)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    else:
        beside = tmp_path / "replacement.jpg"
        beside.write_bytes(new)
        os.utime(beside, ns=(before.st_atime_ns, before.st_mtime_ns))
        if how == "cp-p":
            subprocess.run(["cp", "-p", str(beside), str(path)], check=True)
        else:
            os.rename(beside, path)
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns) and path.read_bytes() == new
    with pytest.raises(FormatError, match=rf"source item 1 \({key}\) changed since this pack began.*delete"):
        pack(tmp_path / "images", dst, format="tar", shard_size=4, workers=0, progress=False)
    assert not (dst / TarPackState.MANIFEST_NAME).exists()  # nothing finished over the old bytes
