"""A real Ray cluster on loopback for the Ray tests (the pack engine's, worker_method="ray"), and a source that
shows which process read what.

``RayCluster.start(workdir)`` runs ``ray start --head`` and ``ray start --address=...`` (a second raylet),
one CPU each, on 127.0.0.1, with a temporary directory and ports of its own; ``stop_second_node()`` kills the
second raylet's processes (a node lost); ``stop()`` kills exactly the processes of that cluster (those naming
its temporary directory, and their children: the workers), never another Ray on the machine (``ray stop``
would stop them all). Workers import this checkout (``PYTHONPATH``) and use their own fastloader cache.
Nothing runs on import.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.helpers import ROOT, run_child
from tests.pack.wrapped_source import WrappedSource

RAY_BIN = Path(sys.executable).parent / "ray"
# For the cluster and its drivers: no usage report, and no token auth (which a ~/.ray/auth_token left by any
# earlier local ray.init() would switch on for the head alone, and the second raylet then cannot join).
ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
# A node that stops answering is declared dead after about 3 s, not Ray's 15 (the node-loss tests wait for it).
HEALTH_CHECK = '--system-config={"health_check_period_ms": 1000, "health_check_failure_threshold": 3}'


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_start(args: list[str], env: dict[str, str]) -> None:
    done = run_child(
        [str(RAY_BIN), "start", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
         "--object-store-memory=80000000", f"--dashboard-agent-listen-port={_free_port()}",
         f"--dashboard-agent-grpc-port={_free_port()}", f"--metrics-export-port={_free_port()}", *args],
        env=env,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


@dataclass
class RayCluster:
    temp_dir: Path
    address: str
    second: frozenset[int] = frozenset()  # the processes the second raylet's ``ray start`` left running

    @classmethod
    def start(cls, cache: Path) -> RayCluster:
        # Short: Ray's unix sockets live under it (a socket path holds at most 107 bytes).
        temp_dir = Path(tempfile.mkdtemp(prefix="flray-", dir="/tmp"))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FASTLOADER_CACHE": str(cache), **ENV}
        port = _free_port()
        cluster = cls(temp_dir, f"127.0.0.1:{port}")
        try:
            head = [f"--port={port}", "--head", "--include-dashboard=false", f"--temp-dir={temp_dir}", HEALTH_CHECK,
                    # ports of its own: two test modules may each run a cluster at once (make test's -n 2)
                    f"--dashboard-port={_free_port()}"]  # fmt: skip
            _ray_start(head, env)
            before = {process.pid for process in cluster.processes()}
            _ray_start([f"--address={cluster.address}"], env)
            cluster.second = frozenset(process.pid for process in cluster.processes()) - before
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes: those naming its temporary directory, and all their children."""
        found: dict[int, psutil.Process] = {}
        for process in psutil.process_iter(["cmdline"]):
            if any(str(self.temp_dir) in part for part in process.info["cmdline"] or ()):
                found[process.pid] = process
                try:
                    found.update((child.pid, child) for child in process.children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
        found.pop(os.getpid(), None)
        return list(found.values())

    def stop_second_node(self) -> None:
        """SIGKILL the second raylet and every process of its node (its workers with it): a node lost."""
        self._kill(
            [process for process in self.processes() if process.pid in self.second or self._under_second(process)]
        )

    def _under_second(self, process: psutil.Process) -> bool:
        try:
            return any(parent.pid in self.second for parent in process.parents())
        except psutil.NoSuchProcess:
            return False

    def stop(self) -> None:
        self._kill(self.processes())
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    @staticmethod
    def _kill(processes: list[psutil.Process]) -> None:
        for process in processes:
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(processes, timeout=30)


class LoggedSource(WrappedSource):
    """A source that appends each position it reads to ``log_dir/<pid>.log`` and then sleeps ``delay``
    seconds (the cost of an image, so that a process can be killed mid-shard): the log says which process
    read what, in which run. Picklable: Ray ships it to the tasks."""

    def __init__(self, inner: Any, log_dir: str | os.PathLike[str], delay: float) -> None:
        super().__init__(inner)
        self.log_dir, self.delay = str(log_dir), delay

    def read(self, index: int) -> bytes:
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, f"{os.getpid()}.log"), "a") as log:
            log.write(f"{index}\n")
        time.sleep(self.delay)
        return super().read(index)


def reads(log_dir: Path) -> dict[int, list[int]]:
    """The positions each process read, by pid, in order (see LoggedSource)."""
    if not log_dir.is_dir():
        return {}
    return {int(path.stem): [int(line) for line in path.read_text().split()] for path in log_dir.glob("*.log")}
