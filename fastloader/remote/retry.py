"""When to try a request again, and how long to wait: the fault behaviour of every remote read and write.

Retried: throttling (503 SlowDown, 429, "Throttling" codes), server errors (500, 502, 503, 504),
timeouts, refused or reset connections, and bodies shorter than announced (``TruncatedBody``, from our
own length check). Not retried: what another attempt cannot fix (no such key, access denied, a bad
signature, no credentials): those raise at once, naming the object.

Waits grow exponentially with full jitter (AWS's advice for many clients hitting one service:
``uniform(0, min(cap, base * 2**attempt))``), so the workers of many ranks never retry in step. After
``attempts`` tries a :class:`~fastloader.errors.RemoteError` names the object, the attempts and the last error.

No secret ever reaches a message: the text of every error we raise goes through
:func:`~fastloader.errors.redact` (the
userinfo of URLs, ``http://user:password@host``, and credentials in query strings), and the
client's exception is not chained to ours (its text and its own chain may quote the endpoint URL, and
a worker's traceback travels as text): a RemoteError carries the server's ``status`` and ``code`` instead.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from fastloader.errors import RemoteError, TruncatedBody, redact

T = TypeVar("T")
log = logging.getLogger("fastloader")

_RETRY_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "OperationAborted",
}
_RETRY_STATUS = {429, 500, 502, 503, 504}


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 10
    base_s: float = 0.1
    cap_s: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
        return rng.uniform(0.0, min(self.cap_s, self.base_s * (2**attempt)))


def is_retryable(error: BaseException) -> bool:
    """Whether another attempt may succeed (see the module docstring)."""
    if isinstance(error, TruncatedBody):
        return True
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore's ClientError
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code in _RETRY_CODES or status in _RETRY_STATUS
    try:
        from botocore import exceptions as botocore_errors
    except ImportError:  # pragma: no cover - boto3 is what makes the requests
        botocore_errors = None
    if botocore_errors is not None:
        if isinstance(error, botocore_errors.NoCredentialsError):
            return False
        transient = (
            botocore_errors.ConnectionError,  # EndpointConnectionError, connect timeouts
            botocore_errors.HTTPClientError,  # ConnectionClosedError, ReadTimeoutError
            botocore_errors.ReadTimeoutError,
            botocore_errors.ResponseStreamingError,
            botocore_errors.IncompleteReadError,
        )
        if isinstance(error, transient):
            return True
    import http.client

    from urllib3 import exceptions as urllib3_errors

    return isinstance(error, (ConnectionError, TimeoutError, http.client.IncompleteRead, urllib3_errors.HTTPError))


def with_retries(what: str, attempt: Callable[[], T], policy: RetryPolicy, rng: random.Random | None = None) -> T:
    """``attempt()`` until it succeeds, retrying transient failures; RemoteError naming ``what`` at the end.

    A RemoteError from ``attempt`` (e.g. :class:`~fastloader.errors.ObjectChanged`) is final and passes
    through as it is."""
    rng = rng or random.Random()
    for number in range(policy.attempts):
        try:
            return attempt()
        except RemoteError:
            raise
        except Exception as error:  # noqa: BLE001 - sorted below: transient or not
            failure = error
        # Raised here, outside the handler, so that the client's exception is not our error's context.
        if not is_retryable(failure):
            raise _remote_error(f"{what}: {_describe(failure)}", failure)
        if number + 1 == policy.attempts:
            raise _remote_error(
                f"{what}: failed {policy.attempts} times (retried with backoff); last error: {_describe(failure)}",
                failure,
            )
        wait = policy.delay(number, rng)
        log.debug("%s: %s; retry %d in %.2f s", what, redact(_describe(failure)), number + 1, wait)
        time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def _remote_error(message: str, error: BaseException) -> RemoteError:
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return RemoteError(message)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = response.get("Error", {}).get("Code")
    return RemoteError(message, status=status, code=None if code is None else str(code))


def _describe(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        info = response.get("Error", {})
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{info.get('Code', 'error')} (HTTP {status}): {info.get('Message', '')}".strip()
    return f"{type(error).__name__}: {error}"
