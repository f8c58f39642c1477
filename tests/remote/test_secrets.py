"""No secret in any error text: a password in the endpoint URL, the secret key (right or wrong) and a session
token never appear in a RemoteError's str or repr, in its cause chain, or in its formatted traceback (what a
worker's error carries to the training process). Against the real SeaweedFS server and the fault proxy."""

from __future__ import annotations

import secrets
import socket
import traceback
from typing import Any

import pytest

from fastloader.errors import RemoteError, redact
from fastloader.remote.retry import RetryPolicy
from fastloader.remote.s3 import S3Store
from fastloader.remote.url import S3Url
from tests.remote import fault_proxy as faults

PASSWORD = f"pw-{secrets.token_hex(8)}"
QUICK = RetryPolicy(attempts=2, base_s=0.01, cap_s=0.01)


def _texts(error: BaseException) -> list[str]:
    """Every text an error shows: its formatted traceback, and str / repr / args of each error in its chain."""
    texts = ["".join(traceback.format_exception(error))]
    seen: BaseException | None = error
    while seen is not None:
        texts += [str(seen), repr(seen), *(str(arg) for arg in seen.args)]
        seen = seen.__cause__ or seen.__context__
    return texts


def _assert_hidden(error: BaseException, *hidden: str) -> None:
    for text in _texts(error):
        for secret in hidden:
            assert secret not in text, f"{secret!r} shown in: {text}"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_password_in_the_endpoint_url_is_never_shown(s3_env: Any, s3_bucket: str, fault_proxy: Any) -> None:
    refused = S3Store(f"http://reader:{PASSWORD}@127.0.0.1:{_closed_port()}", retry=QUICK)
    with pytest.raises(RemoteError) as caught:  # botocore's message quotes the endpoint URL
        refused.get(S3Url(s3_bucket, "a.tar"))
    assert "127.0.0.1" in str(caught.value) and "***@" in str(caught.value)  # still says where
    _assert_hidden(caught.value, PASSWORD)
    fault_proxy.add(faults.stall(2.0, method="GET", key="a.tar", times=None))
    host = fault_proxy.url.removeprefix("http://")
    stalled = S3Store(f"http://reader:{PASSWORD}@{host}", retry=QUICK, read_timeout=0.3)
    with pytest.raises(RemoteError, match="failed 2 times") as caught:  # a read timeout quotes it too
        stalled.get(S3Url(s3_bucket, "a.tar"))
    _assert_hidden(caught.value, PASSWORD)


def test_neither_the_secret_key_nor_a_session_token_is_shown(
    s3_env: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = f"token-{secrets.token_hex(16)}"
    wrong = f"wrong-{secrets.token_hex(12)}"
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    with pytest.raises(RemoteError) as caught:
        S3Store(retry=QUICK).get(S3Url(s3_bucket, "a.tar"))
    _assert_hidden(caught.value, token, s3_env.secret_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    with pytest.raises(RemoteError) as caught:
        S3Store(retry=QUICK).get(S3Url(s3_bucket, "a.tar"))
    assert caught.value.status == 403  # the server's answer is kept, as an attribute
    _assert_hidden(caught.value, token, wrong, s3_env.secret_key)


def test_redact_removes_userinfo_and_query_credentials() -> None:
    text = redact(
        'Could not connect to "https://me:p@ss@host:9000/b/k?X-Amz-Credential=AKIA/x&X-Amz-Signature=abc&x=1"'
    )
    assert text == 'Could not connect to "https://***@host:9000/b/k?X-Amz-Credential=***&X-Amz-Signature=***&x=1"'
