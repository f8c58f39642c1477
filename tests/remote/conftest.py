"""Fixtures for tests against real S3-compatible storage: a SeaweedFS server on loopback and a fault proxy.

- ``s3_server`` (session): a running S3Server; every test using it is skipped when ``weed`` is not installed.
- ``s3_bucket`` (function): the name of a new, empty bucket on it.
- ``s3_env`` (function): the standard AWS_* variables point at the server (no ~/.aws files read); yields the server.
- ``fault_proxy`` (function): a FaultProxy in front of the server, no rules; stopped after the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.remote.fault_proxy import FaultProxy
from tests.remote.s3_server import WEED_MISSING, S3Server, find_weed

# Variables that would override or add to the credentials and endpoint s3_env sets.
_AWS_VARS_TO_UNSET = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_SKIP_SIGNATURE",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "AWS_BUCKET",
    "AWS_BUCKET_NAME",
)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if find_weed() is None:
        pytest.skip(WEED_MISSING)
    server = S3Server.start(tmp_path_factory.mktemp("s3server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    return s3_server.make_bucket(f"test-{uuid.uuid4().hex[:16]}")


@pytest.fixture
def s3_env(s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for name in _AWS_VARS_TO_UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    # Files that do not exist: nothing in the developer's ~/.aws (a profile, a region, an endpoint) leaks in.
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    return s3_server


@pytest.fixture
def fault_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.endpoint_url).start()
    try:
        yield proxy
    finally:
        proxy.stop()
