"""``fastloader pack --engine ray`` on a real Ray cluster: a head and a second raylet (``ray start``, one CPU
each, on loopback), shared by this module. The same samples as the local engine, sample by sample; a Ray
worker SIGKILLed mid-shard; the driver SIGKILLed and the same pack run again; the CLI and its JSON; S3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastloader import DataLoaderX
from fastloader.datasets import TarShardDataset
from fastloader.datasets.folder import FolderSource
from fastloader.datasets.sources import open_source
from fastloader.errors import FormatError, MissingField
from fastloader.pack import pack, verify
from fastloader.pack.ray_job import JOB_DIR
from fastloader.pack.summary import report_path
from tests.field_items import FieldItems, assert_same_value
from tests.helpers import ROOT, finish, run_child, wait_until
from tests.images import write_image_folder
from tests.pack.ray_cluster import ENV as RAY_ENV
from tests.pack.ray_cluster import LoggedSource, RayCluster, reads
from tests.remote import conftest as remote_fixtures
from tests.remote.shards import identity

s3_server, s3_bucket, s3_env = remote_fixtures.s3_server, remote_fixtures.s3_bucket, remote_fixtures.s3_env  # for S3

pytest.importorskip("ray.data", reason="the Ray engine needs ray[data] (pip install fastloader[ray])")
# Ray Data's own DataContext warns about its own deprecated settings.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")

CLI = [sys.executable, "-m", "fastloader.cli"]
BAD = {"class_0/bad_empty.jpg": b"", "class_1/bad_text.jpg": b"not an image\n", "class_2/bad_cut.jpg": b"\xff\xd8\xff"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in RAY_ENV.items():  # this process and the drivers it starts
            patch.setenv(name, value)
        started = RayCluster.start(tmp_path_factory.mktemp("ray-cache"))
        try:
            yield started
        finally:
            started.stop()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 real images in 3 classes, and 3 bad files among them."""
    root = tmp_path_factory.mktemp("src") / "images"
    write_image_folder(root, count=30)
    for key, data in BAD.items():
        (root / key).write_bytes(data)
    return root


def _samples(path: Path) -> list[tuple[Any, ...]]:
    """(source key, label, image bytes, fields) of every sample of a pack, in order."""
    source, _ = open_source(str(path))
    key = getattr(source, "source_key", source.key)
    kinds = source.field_kinds() if hasattr(source, "field_kinds") else {}
    rows = []
    for i in range(len(source)):
        fields = {}
        for name in kinds:
            try:
                fields[name] = source.read_field(i, name)
            except MissingField:  # a sample may lack a field
                continue
        rows.append((key(i), source.label(i), source.read(i), fields))
    return rows


def _manifest(path: Path, name: str = "fastloader-tar.json") -> dict[str, Any]:
    return dict(json.loads((path / name).read_text()))


def test_a_ray_pack_holds_the_local_packs_samples_with_the_same_skipped_items(
    cluster: RayCluster, folder: Path, tmp_path: Path
) -> None:
    local, ray = tmp_path / "local", tmp_path / "ray"
    expected = pack(folder, local, format="tar", shard_size=4, resize_max_side=40, workers=0, progress=False)
    summary = pack(
        folder, ray, format="tar", shard_size=4, resize_max_side=40, engine="ray", ray_address=cluster.address,
        progress=False,
    )  # fmt: skip
    assert _samples(ray) == _samples(local) and len(_samples(ray)) == 30  # keys, labels, bytes, in source order
    assert [(s.position, s.key, s.reason[:30]) for s in summary.skipped] == [
        (s.position, s.key, s.reason[:30])
        for s in expected.skipped  # the rest names a BytesIO's address
    ]
    assert sorted(s.key for s in summary.skipped) == sorted(BAD)
    assert len(Path(report_path(ray)).read_text().splitlines()) == 4  # its header, and the 3
    assert (summary.packed, summary.packed_now, summary.total, summary.engine, summary.shards) == (30, 30, 33, "ray", 8)
    assert (summary.bytes_in, summary.bytes_out) == (expected.bytes_in, expected.bytes_out)
    manifest = _manifest(ray)
    assert manifest["meta"] | {"source": None} == {
        "source": None, "source_kind": "folder", "engine": "ray", "order": "source", "shard_span": 4,
    }  # fmt: skip
    assert manifest["classes"] == _manifest(local)["classes"] == ["class_0", "class_1", "class_2"]
    # Shard i holds positions 4i .. 4i+3 less the skipped ones; the last range (32: bad_cut.jpg) holds no sample.
    assert [s["end_position"] for s in manifest["shards"]] == [4 * (i + 1) for i in range(8)]
    assert [s["count"] for s in manifest["shards"]] == [4, 4, 3, 4, 4, 3, 4, 4]
    assert verify(ray).ok
    assert not (ray / JOB_DIR).exists()
    dataset = TarShardDataset(ray, transform=lambda image: np.array(image.resize((8, 8))))
    labels = [int(label) for _, batch in DataLoaderX(dataset, batch_size=4, num_workers=0) for label in batch]
    assert labels == [label for _, label, _, _ in _samples(local)]
    again = pack(folder, ray, format="tar", shard_size=4, resize_max_side=40, engine="ray", progress=False)
    assert (again.resumed_from, again.packed_now, again.shards_now) == (33, 0, 0)
    assert "already complete" in again.format_text()


@pytest.mark.parametrize("output", ["parquet", "tar"])
def test_fields_of_every_kind_are_the_local_packs(cluster: RayCluster, tmp_path: Path, output: str) -> None:
    items = FieldItems(10)
    local, ray = tmp_path / "local", tmp_path / "ray"
    pack(items, local, format=output, shard_size=3, quality=80, workers=0, progress=False)
    summary = pack(
        items, ray, format=output, shard_size=3, quality=80, engine="ray", ray_address=cluster.address,
        progress=False,
    )  # fmt: skip
    got, want = _samples(ray), _samples(local)
    assert len(got) == len(want) == 10 and summary.shards == 4
    for (key, label, image, fields), (key2, label2, image2, fields2) in zip(got, want):
        assert (key, label, image) == (key2, label2, image2)
        assert fields.keys() == fields2.keys() == items.values(int(key.rsplit("/", 1)[1])).keys()
        for name, value in fields2.items():
            assert_same_value(fields[name], value, f"{key} {name}")
    manifest = {"parquet": "_fastloader-parquet.json", "tar": "fastloader-tar.json"}[output]
    assert _manifest(ray, manifest)["fields"] == _manifest(local, manifest)["fields"]
    assert verify(ray).ok


def test_a_worker_killed_mid_shard_is_retried_and_every_sample_is_there_once(
    cluster: RayCluster, folder: Path, tmp_path: Path
) -> None:
    log, dst = tmp_path / "reads", tmp_path / "ray"
    source = LoggedSource(FolderSource(folder), log, delay=0.1)
    killed: list[tuple[int, list[int]]] = []

    def kill_a_worker_mid_shard() -> None:
        def mid_shard() -> bool:  # a worker that has read the 3rd of the 4 positions of its shard, and not more
            return any(positions[-1] % 4 == 2 for positions in reads(log).values() if positions)

        if wait_until(mid_shard, timeout=120, interval=0.005):
            pid, positions = next((p, r) for p, r in reads(log).items() if r and r[-1] % 4 == 2)
            os.kill(pid, signal.SIGKILL)
            killed.append((pid, positions))

    killer = threading.Thread(target=kill_a_worker_mid_shard)
    killer.start()
    try:
        summary = pack(source, dst, format="tar", shard_size=4, engine="ray", ray_address=cluster.address)
    finally:
        killer.join()
    assert killed, "no worker was found mid-shard"
    pid, positions = killed[0]
    redone = [p for other, read in reads(log).items() if other != pid for p in read if p in positions[-3:]]
    assert sorted(redone) == sorted(positions[-3:])  # the killed task's shard was read again, by another worker
    assert [(key, label, data) for key, label, data, _ in _samples(dst)] == [
        (key, label, data) for key, label, data, _ in _samples_of(folder)
    ]
    assert sorted(s.key for s in summary.skipped) == sorted(BAD) and summary.packed == 30
    assert verify(dst).ok and not (dst / JOB_DIR).exists()


def _samples_of(folder: Path) -> list[tuple[Any, ...]]:
    source = FolderSource(folder)
    good = [i for i in range(len(source)) if source.key(i) not in BAD]
    return [(source.key(i), source.label(i), source.read(i), {}) for i in good]


_DRIVER = """
import json, sys
from fastloader import DataLoaderX
from fastloader.datasets import TarShardDataset
from fastloader.datasets.folder import FolderSource
from fastloader.pack import pack
from tests.pack.ray_cluster import LoggedSource
folder, dst, log, address = sys.argv[1:5]
summary = pack(LoggedSource(FolderSource(folder), log, 0.15), dst, format="tar", shard_size=3, engine="ray",
               ray_address=address, progress=False)
print(json.dumps(summary.to_dict()))
"""


def _driver(folder: Path, dst: Path, log: Path, address: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(folder), str(dst), str(log), address],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_a_killed_driver_run_again_redoes_only_the_unfinished_shards(
    cluster: RayCluster, folder: Path, tmp_path: Path
) -> None:
    dst, done_dir = tmp_path / "ray", tmp_path / "ray" / JOB_DIR / "done"
    first = _driver(folder, dst, tmp_path / "reads-1", cluster.address)
    recorded = lambda: len(list(done_dir.glob("*.json"))) if done_dir.is_dir() else 0  # noqa: E731
    assert wait_until(lambda: recorded() >= 2 or first.poll() is not None, timeout=120)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    done = sorted(int(path.stem) for path in done_dir.glob("*.json"))
    assert 2 <= len(done) < 11, f"{first.returncode}: {first.stderr.read()}"  # 33 positions: 11 shards of 3
    second = _driver(folder, dst, tmp_path / "reads-2", cluster.address)
    out, err = finish(second)
    assert second.returncode == 0, err
    summary = json.loads(out)
    read_again = sorted(p for positions in reads(tmp_path / "reads-2").values() for p in positions)
    unfinished = [p for shard in range(11) if shard not in done for p in range(3 * shard, min(3 * shard + 3, 33))]
    assert read_again == unfinished  # the shards recorded as done were not packed again
    assert summary["resumed_from"] == 3 * len(done) and summary["shards_now"] == 11 - len(done)
    assert summary["packed"] == 30 and summary["engine"] == "ray"
    assert [row[:3] for row in _samples(dst)] == [row[:3] for row in _samples_of(folder)]
    assert verify(dst).ok


def test_the_cli_packs_on_ray_with_the_local_json_summary(cluster: RayCluster, folder: Path, tmp_path: Path) -> None:
    dst = tmp_path / "ray"
    done = run_child(
        [*CLI, "pack", str(folder), str(dst), "--engine", "ray", "--ray-address", cluster.address, "--format",
         "parquet", "--shard-size", "8", "--json", "--no-progress"],
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    local = pack(folder, tmp_path / "local", format="parquet", workers=0, progress=False).to_dict()
    assert summary.keys() == local.keys()  # the same summary
    assert (summary["packed"], summary["total"], summary["shards"], len(summary["skipped"])) == (30, 33, 4, 3)
    assert summary["by_reason"] == local["by_reason"] and summary["images_per_s"] > 0
    checked = run_child([*CLI, "verify", str(dst), "--no-progress"])
    assert checked.returncode == 0 and checked.stdout.startswith("OK: 30 records verified"), checked.stdout


def test_an_lmdb_and_other_combinations_are_refused_before_any_work(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--engine ray writes tar shards \(--format tar\) or Parquet files"):
        pack(folder, tmp_path / "out.lmdb", format="lmdb", engine="ray")
    with pytest.raises(ValueError, match="packs to S3 are tar shards"):
        pack(folder, "s3://bucket/prefix", format="parquet", engine="ray")
    with pytest.raises(ValueError, match="workers is for --engine local"):
        pack(folder, tmp_path / "out", engine="ray", workers=2)
    with pytest.raises(ValueError, match=r"--ray-address \(ray_address=\) is for --engine ray"):
        pack(folder, tmp_path / "out", ray_address="auto")
    with pytest.raises(ValueError, match="engine must be local or ray"):
        pack(folder, tmp_path / "out", engine="spark")
    done = run_child([*CLI, "pack", str(folder), str(tmp_path / "o"), "--engine", "ray", "--format", "lmdb"])
    assert done.returncode == 1 and "LMDB is one file with a single writer" in done.stderr
    pack(folder, tmp_path / "local", format="tar", workers=0, progress=False)
    with pytest.raises(FormatError, match="holds a different pack"):
        pack(folder, tmp_path / "local", format="tar", engine="ray")
    assert not (tmp_path / "out").exists()


def test_a_ray_pack_to_s3_is_uploaded_content_named_with_the_manifest_last(
    cluster: RayCluster, folder: Path, tmp_path: Path, s3_env: Any, s3_bucket: str
) -> None:
    import ray

    url = f"s3://{s3_bucket}/ray"
    env = {name: value for name, value in os.environ.items() if name.startswith("AWS_")}
    ray.init(address=cluster.address, runtime_env={"env_vars": env}, log_to_driver=False)  # the nodes' credentials
    try:
        summary = pack(folder, url, shard_size=4, engine="ray", progress=False)
    finally:
        ray.shutdown()
    assert summary.dst == url and summary.packed == 30 and summary.report_path == f"{url}/skipped.tsv"
    keys = sorted(item["Key"] for item in s3_env.client().list_objects_v2(Bucket=s3_bucket)["Contents"])
    shards = [key for key in keys if key.endswith(".tar")]
    assert len(shards) == 8 and all(len(key.rsplit("-", 1)[1]) == len("0123456789abcdef.tar") for key in shards)
    assert "ray/fastloader-tar.json" in keys and "ray/fastloader-tar.progress.json" not in keys
    dataset = TarShardDataset(url, decode=identity, shard_cache=tmp_path / "cache")
    local = pack(folder, tmp_path / "local", format="tar", shard_size=4, workers=0, progress=False)
    expected = [(data, label) for _, label, data, _ in _samples(tmp_path / "local")]
    assert local.packed == 30
    assert [(bytes(dataset[i][0]), int(dataset[i][1])) for i in range(len(dataset))] == expected


def test_a_full_disk_stops_the_job_keeping_its_shards_and_the_same_pack_then_finishes(
    cluster: RayCluster, tiny_disk: Path, tmp_path: Path
) -> None:
    items = write_image_folder(tmp_path / "images", count=300)  # about 1.4 MB: more than the disk holds
    dst, options = tiny_disk / "ray", {"format": "tar", "shard_size": 50, "engine": "ray", "progress": False}
    stopped = r"the Ray pack stopped with \d of 6 shards done \(kept\); \d failed, the first: .*shard \d .*No space"
    with pytest.raises(RuntimeError, match=stopped):
        pack(tmp_path / "images", dst, ray_address=cluster.address, **options)
    with pytest.raises(FormatError, match="incomplete pack"):
        TarShardDataset(dst)
    grown = subprocess.run(["mount", "-o", "remount,size=16m", str(tiny_disk)], capture_output=True)
    assert grown.returncode == 0, grown.stderr.decode()
    summary = pack(tmp_path / "images", dst, ray_address=cluster.address, **options)
    assert summary.resumed_from > 0 and summary.shards_now < 6  # the shards done before were kept
    assert [row[:3] for row in _samples(dst)] == items
    assert verify(dst).ok


class ChangingArrays(FieldItems):
    """An array field whose dtype changes at item 4: a Parquet file then ends early (a column has one type)."""

    kinds = {"vec": "array"}

    def values(self, index: int) -> dict[str, Any]:
        return {"vec": np.arange(3, dtype=np.float32 if index < 4 else np.int64) + index}


def test_a_range_cut_by_a_changing_column_type_is_two_files_in_order(cluster: RayCluster, tmp_path: Path) -> None:
    summary = pack(
        ChangingArrays(8), tmp_path / "ray", format="parquet", shard_size=6, engine="ray", ray_address=cluster.address,
        progress=False,
    )  # fmt: skip
    shards = _manifest(tmp_path / "ray", "_fastloader-parquet.json")["shards"]
    assert [(s["name"], s["count"], s["end_position"]) for s in shards] == [
        ("part-000000.parquet", 4, 4), ("part-000000_1.parquet", 2, 6), ("part-000001.parquet", 2, 8),
    ]  # fmt: skip
    assert summary.shards == 3 and verify(tmp_path / "ray").ok
    pack(ChangingArrays(8), tmp_path / "local", format="parquet", shard_size=6, workers=0, progress=False)
    got, want = _samples(tmp_path / "ray"), _samples(tmp_path / "local")
    assert [row[:3] for row in got] == [row[:3] for row in want]
    for (key, _, _, fields), (_, _, _, expected) in zip(got, want):
        assert_same_value(fields["vec"], expected["vec"], key)


def test_a_ray_pack_holds_its_destination_against_a_local_pack_and_the_other_way(
    cluster: RayCluster, folder: Path, tmp_path: Path, gated_pack: Any
) -> None:
    from fastloader.errors import DestinationLocked
    from fastloader.pack.dest_lock import lock_path
    from tests.pack.gated_source import wait_for_lock

    local_dst = tmp_path / "local"  # a local pack holds it: a Ray pack is refused before it starts a task
    running = gated_pack(folder, local_dst, "tar")
    wait_for_lock(local_dst, tmp_path, running)
    with pytest.raises(DestinationLocked, match=f"pid {running.pid} on host"):
        pack(folder, local_dst, format="tar", engine="ray", ray_address=cluster.address, progress=False)
    (tmp_path / "gate").touch()
    finish(running)
    assert running.returncode == 0
    (tmp_path / "gate").unlink()
    (tmp_path / "markers").rename(tmp_path / "markers-local")

    dst = tmp_path / "ray"
    driver = gated_pack(folder, dst, "tar", cluster.address)  # a Ray pack, held in its tasks
    wait_for_lock(dst, tmp_path, driver)
    local = run_child(
        [*CLI, "pack", str(folder), str(dst), "--format", "tar", "--workers", "0", "--no-progress"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert local.returncode == 1 and f"writing into it: pid {driver.pid} on host" in local.stderr, local.stderr
    (tmp_path / "gate").touch()
    _, err = finish(driver)
    assert driver.returncode == 0, err
    assert [row[:3] for row in _samples(dst)] == [row[:3] for row in _samples_of(folder)]
    assert verify(dst).ok and not lock_path(dst).exists()
