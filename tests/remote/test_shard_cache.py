"""The shard cache: one download per object, never over its limit, least recently used out, never stuck."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fastloader.remote.shard_cache import ShardCache


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
