"""The machine's traps: each found from the real machine's figures, each with its fix."""

from __future__ import annotations

import json

from fastloader.doctor.environment import environment, shm_bytes
from fastloader.gil import gil_report
from fastloader.world import cores_per_rank
from tests.helpers import run_python


def names(traps: list[dict[str, str]]) -> list[str]:
    return [trap["name"] for trap in traps]


def test_batches_in_flight_larger_than_dev_shm_are_a_trap() -> None:
    shm = shm_bytes()
    assert shm is not None and shm > 0
    env, traps = environment(batch_bytes=shm // 4, num_workers=1, prefetch_factor=2)  # 4 batches in flight
    assert env["shm_needed_bytes"] == shm // 4 * 4
    trap = next(t for t in traps if t["name"] == "shm_too_small")
    assert "bus error" in trap["message"] and "--shm-size" in trap["fix"]
    _, fine = environment(batch_bytes=1 << 20, num_workers=1, prefetch_factor=2)
    assert "shm_too_small" not in names(fine)


def test_no_workers_need_no_shared_memory() -> None:
    env, traps = environment(batch_bytes=1 << 40, num_workers=0, prefetch_factor=None)
    assert env["shm_needed_bytes"] == 0 and "shm_too_small" not in names(traps)


def test_a_low_open_files_limit_is_a_trap() -> None:
    code = (
        "import json, resource; resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit("
        "resource.RLIMIT_NOFILE)[1])); from fastloader.doctor.environment import environment;"
        "print(json.dumps(environment(1024, 1, 2)))"
    )
    out = run_python(code, timeout=120)
    assert out.returncode == 0, out.stderr
    env, traps = json.loads(out.stdout)
    assert env["open_files_limit"] == 256
    trap = next(t for t in traps if t["name"] == "open_files_limit")
    assert "256" in trap["message"] and "ulimit -n" in trap["fix"]


def test_more_workers_than_usable_cores_is_a_trap() -> None:
    cores = cores_per_rank()  # affinity, cgroup quota and the ranks of this machine
    _, traps = environment(batch_bytes=1024, num_workers=cores + 1, prefetch_factor=2)
    assert "workers_over_cores" in names(traps)
    _, fine = environment(batch_bytes=1024, num_workers=cores, prefetch_factor=2)
    assert "workers_over_cores" not in names(fine)


def test_the_environment_says_whether_the_gil_is_on() -> None:
    env, traps = environment(batch_bytes=1 << 20, num_workers=0, prefetch_factor=None)
    assert env["gil"] == gil_report()
    assert env["gil"].startswith("on (") or env["gil"].startswith("off (")
    assert "gil_enabled" not in names(traps) or env["gil"].startswith("on: turned back on by importing")
