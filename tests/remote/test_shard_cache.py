"""The shard cache: one download per object version, never over its limit, least recently used out, never stuck:
a download killed midway blocks no one, and a wait that sees no progress ends in an error naming the object."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fastloader.errors import CacheStuck, RemoteError
from fastloader.remote.shard_cache import ShardCache
from tests.helpers import wait_until


def writer(content: bytes, log: list[str] | None = None, name: str = "") -> Callable[[str], None]:
    def fetch(path: str) -> None:
        if log is not None:
            log.append(name)
        Path(path).write_bytes(content)

    return fetch


def test_a_miss_fetches_once_and_a_hit_reads_the_file(tmp_path: Path) -> None:
    cache, fetched = ShardCache(tmp_path / "cache", limit=1000), []
    first = cache.path("bucket/a.tar", 5, writer(b"hello", fetched, "a"))
    again = cache.path("bucket/a.tar", 5, writer(b"XXXXX", fetched, "a"))
    assert first == again and Path(first).read_bytes() == b"hello" and fetched == ["a"]


def test_least_recently_used_out_and_never_over_the_limit(tmp_path: Path) -> None:
    cache, fetched = ShardCache(tmp_path / "cache", limit=100), []
    for name in ("a", "b"):
        cache.path(name, 40, writer(bytes(40), fetched, name))
        time.sleep(0.01)
    cache.path("a", 40, writer(bytes(40), fetched, "a"))  # a is now the most recently used
    time.sleep(0.01)
    cache.path("c", 40, writer(bytes(40), fetched, "c"))  # 120 > 100: b goes
    assert cache.used() <= 100 and fetched == ["a", "b", "c"]
    cache.path("a", 40, writer(bytes(40), fetched, "a"))
    assert fetched == ["a", "b", "c"]  # a stayed
    cache.path("b", 40, writer(bytes(40), fetched, "b"))
    assert fetched[-1] == "b" and cache.used() <= 100


def test_a_working_set_larger_than_the_limit_evicts_and_fetches_again(tmp_path: Path) -> None:
    cache, fetched = ShardCache(tmp_path / "cache", limit=100), []
    for _ in range(3):
        for name in "abcd":  # 4 x 40 bytes through a 100-byte cache
            path = cache.path(name, 40, writer(name.encode() * 40, fetched, name))
            assert Path(path).read_bytes() == name.encode() * 40
            assert cache.used() <= 100
    assert len(fetched) == 12  # every access a miss: slower, never stuck


def test_an_object_larger_than_the_limit_is_an_error_naming_it(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", limit=10)
    with pytest.raises(ValueError, match="s3://b/huge.tar: 11 bytes do not fit"):
        cache.path("s3://b/huge.tar", 11, writer(bytes(11)))


def test_a_failed_fetch_leaves_nothing_and_a_short_one_is_refused(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", limit=100)

    def broken(path: str) -> None:
        Path(path).write_bytes(b"abc")
        raise ConnectionError("reset")

    with pytest.raises(ConnectionError):
        cache.path("x", 10, broken)
    assert cache.used() == 0
    with pytest.raises(OSError, match="fetched 3 bytes, expected 10"):
        cache.path("x", 10, writer(b"abc"))
    assert cache.used() == 0


def test_a_download_abandoned_by_a_dead_process_is_reclaimed(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", limit=100)
    (tmp_path / "cache" / "0123456789ab-dead.tar.90.part").write_bytes(bytes(10))  # no process holds its lock
    cache.path("fresh", 50, writer(bytes(50)))
    assert cache.used() == 50


def test_threads_sharing_a_small_cache_never_take_it_over_its_limit(tmp_path: Path) -> None:
    cache, peak, done = ShardCache(tmp_path / "cache", limit=100), [0], threading.Event()

    def fetch(path: str) -> None:
        with open(path, "wb") as out:  # truncates first, as a real download does: still counted in full
            for _ in range(3):
                out.write(bytes(10))
                out.flush()
                time.sleep(0.001)

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], cache.used())

    def read(offset: int) -> None:
        for i in range(150):
            cache.path(f"o{(7 * i + offset) % 9}", 30, fetch)

    watcher = threading.Thread(target=watch)
    watcher.start()
    readers = [threading.Thread(target=read, args=(k,)) for k in range(3)]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join()
    done.set()
    watcher.join()
    assert 0 < peak[0] <= 100


def _fetch_in_process(root: str, count_file: str, start: float) -> str:
    def fetch(path: str) -> None:
        with open(count_file, "a") as log:
            log.write(f"{os.getpid()}\n")
        time.sleep(0.3)  # long enough for every process to ask meanwhile
        Path(path).write_bytes(b"x" * 64)

    time.sleep(max(0.0, start - time.time()))
    return ShardCache(root, limit=1000).path("shared.tar", 64, fetch)


def test_processes_asking_for_one_object_download_it_once(tmp_path: Path) -> None:
    count_file = tmp_path / "fetches.log"
    start = time.time() + 0.5
    with multiprocessing.get_context("fork").Pool(4) as pool:
        paths = pool.starmap(_fetch_in_process, [(str(tmp_path / "cache"), str(count_file), start)] * 4)
    assert len(set(paths)) == 1 and Path(paths[0]).read_bytes() == b"x" * 64
    assert len(count_file.read_text().split()) == 1


def test_each_version_of_an_object_is_its_own_entry(tmp_path: Path) -> None:
    cache, fetched = ShardCache(tmp_path / "cache", limit=1000), []
    old = cache.path("s3://b/a.tar", 5, writer(b"one..", fetched, "e1"), version='"e1"')
    new = cache.path("s3://b/a.tar", 5, writer(b"two..", fetched, "e2"), version='"e2"')  # replaced, same size
    assert Path(old).read_bytes() == b"one.." and Path(new).read_bytes() == b"two.." and fetched == ["e1", "e2"]


def _download_then_hang(root: str, ready: str, limit: int) -> None:
    """Start downloading obj.tar (100 bytes): 60 written, then no progress until killed."""

    def fetch(path: str) -> None:
        with open(path, "wb") as out:
            out.write(bytes(60))
            out.flush()
        Path(ready).touch()
        time.sleep(600)

    ShardCache(root, limit).path("obj.tar", 100, fetch)


def _read_into(root: str, limit: int, result: str) -> None:
    Path(result).write_text(ShardCache(root, limit).path("obj.tar", 100, writer(b"y" * 100)))


def _stuck_download(tmp_path: Path, limit: int) -> multiprocessing.process.BaseProcess:
    ready = tmp_path / "ready"
    process = multiprocessing.get_context("fork").Process(
        target=_download_then_hang, args=(str(tmp_path / "cache"), str(ready), limit)
    )
    process.start()
    if not wait_until(ready.exists, 30):
        process.kill()
        pytest.fail("the download did not start")
    return process


def test_a_download_killed_midway_never_blocks_the_next_reader(tmp_path: Path) -> None:
    victim = _stuck_download(tmp_path, limit=150)
    os.kill(victim.pid, signal.SIGKILL)  # as the OOM killer does, mid-body
    victim.join()
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.endswith(".part")]  # it left its .part
    result = tmp_path / "result"
    # The next reader takes the object's lock; its limit (150) is under twice the object (2 x 100).
    reader = multiprocessing.get_context("fork").Process(
        target=_read_into, args=(str(tmp_path / "cache"), 150, str(result))
    )
    reader.start()
    reader.join(30)
    if reader.is_alive():
        reader.kill()
        reader.join()
        pytest.fail("the next reader waits for room that only the dead download's .part holds")
    assert reader.exitcode == 0 and Path(result.read_text()).read_bytes() == b"y" * 100
    assert ShardCache(tmp_path / "cache", 150).used() == 100  # the dead download's bytes are not counted


def test_a_wait_with_no_progress_ends_in_an_error_naming_the_object(tmp_path: Path) -> None:
    victim = _stuck_download(tmp_path, limit=1000)  # alive, holding obj.tar's lock, 100 bytes reserved
    try:
        same = ShardCache(tmp_path / "cache", limit=1000, wait_s=1)
        with pytest.raises(CacheStuck, match=r"obj\.tar: another process has been downloading it .* for 1 s"):
            same.path("obj.tar", 100, writer(b"y" * 100))
        full = ShardCache(tmp_path / "cache", limit=150, wait_s=1)
        with pytest.raises(CacheStuck, match=r"other\.tar: no room for its 100 bytes .* limit 150 bytes"):
            full.path("other.tar", 100, writer(b"z" * 100))
    finally:
        victim.kill()
        victim.join()
    assert full.path("other.tar", 100, writer(b"z" * 100))  # its download dead, the room is there again


def missing(name: str) -> Callable[[str], None]:
    """A fetch of an object the store does not have (what S3Store.download raises for it)."""

    def fetch(path: str) -> None:
        raise RemoteError(f"s3://bucket/{name}: NoSuchKey (HTTP 404)", status=404)

    return fetch


def lock_files(cache: ShardCache) -> list[str]:
    return sorted(name for name in os.listdir(cache.root / ".locks") if name != "space.lock")


def test_a_thousand_missing_shards_are_each_reported_and_leave_no_lock_file(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", limit=1 << 20)
    names = [f"pack/shard-{number:06d}.tar" for number in range(1000)]
    reported = []
    for name in names:
        with pytest.raises(RemoteError) as raised:
            cache.path(name, 100, missing(name), version='"etag"')
        reported.append(str(raised.value))
    assert all(name in text and "404" in text for name, text in zip(names, reported, strict=True))
    assert lock_files(cache) == []
    assert [entry for entry in os.listdir(cache.root) if entry != ".locks"] == []  # no .part either
    assert cache.used() == 0


def test_a_reader_waiting_on_a_failed_download_takes_the_lock_afresh(tmp_path: Path) -> None:
    # The first download fails and removes its lock file while the second reader waits on it: the second
    # must lock the name's new file (never the removed one alongside a third reader), download it itself,
    # and leave no lock file when it fails too.
    cache = ShardCache(tmp_path / "cache", limit=1000)
    started, release = threading.Event(), threading.Event()
    running, overlapped, errors, counting = [0], [False], [], threading.Lock()

    def slow_missing(path: str) -> None:
        with counting:
            running[0] += 1
            overlapped[0] |= running[0] > 1
        started.set()
        release.wait(timeout=30)
        with counting:
            running[0] -= 1
        raise RemoteError("s3://bucket/a.tar: NoSuchKey (HTTP 404)", status=404)

    def read() -> None:
        try:
            cache.path("bucket/a.tar", 5, slow_missing)
        except RemoteError as error:
            errors.append(error)

    first = threading.Thread(target=read)
    first.start()
    assert started.wait(timeout=30)
    waiters = [threading.Thread(target=read) for _ in range(2)]
    for thread in waiters:
        thread.start()
    time.sleep(0.2)  # the waiters are polling the first's lock (not a bound: they wait either way)
    release.set()
    for thread in (first, *waiters):
        thread.join(timeout=60)
    assert len(errors) == 3 and not overlapped[0]
    assert lock_files(cache) == []
