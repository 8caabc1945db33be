"""Which answers of a remote endpoint the harness retries, and how long it waits before each retry.

What the SDKs' users retry: a create refused 429 (after its `Retry-After`), and a 502 or 503 on an
idempotent read or on a create (a gateway's answer: nothing was created, and a create that went through
anyway carries the run's tag, so the leak sweep deletes it). Everything else reaches the runner as it came.
The waits of one request are bounded: past `BUDGET_S` of waiting, or `ATTEMPTS` tries, the last answer
reaches the runner and the case sees it.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping

import httpx

CREATE = re.compile(r"/(v2/)?sandboxes")
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})
TRANSIENT = frozenset({502, 503})
RATE_LIMITED = 429
ATTEMPTS = 6  # tries of one request, the first included
BUDGET_S = 60.0  # waiting, summed over one request's retries
BACKOFF_S = 0.25  # the first wait after a 502/503; doubled after each
MAX_WAIT_S = 10.0  # one wait, whatever Retry-After asks


def retryable(method: str, path: str) -> bool:
    """Is this request one the harness may send again (so its body is kept until it is answered)?"""
    return method in IDEMPOTENT or (method == "POST" and CREATE.fullmatch(path) is not None)


def wait_before_retry(
    method: str, path: str, status: int, headers: Mapping[str, str], attempt: int, waited_s: float
) -> float | None:
    """Seconds to wait before sending the request again after `status`, or None to hand the answer on.
    `attempt`: tries made so far (1 after the first); `waited_s`: time already spent waiting for it."""
    if attempt >= ATTEMPTS or not retryable(method, path):
        return None
    create = method == "POST"
    if status == RATE_LIMITED and create:
        wait = retry_after(headers.get("retry-after", ""))
        wait = BACKOFF_S * 2 ** (attempt - 1) if wait is None else wait
    elif status in TRANSIENT:
        wait = BACKOFF_S * 2 ** (attempt - 1)
    else:
        return None
    wait = min(wait, MAX_WAIT_S)
    return wait if waited_s + wait <= BUDGET_S else None


def retry_after(value: str) -> float | None:
    """A `Retry-After` header's wait in seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def transient_cause(status: int) -> str:
    """The cause a case failed only by this answer is recorded with."""
    return f"endpoint transient ({status})"


class RetryingTransport(httpx.HTTPTransport):
    """The harness's own calls (the leak sweep, killing what a run left): a 429, 502 or 503 is sent again,
    whatever the method, within `ATTEMPTS` and `BUDGET_S`. Its listing and its kills are idempotent, and a
    kill that a gateway dropped leaves a sandbox that costs money."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        waited = 0.0
        for attempt in range(1, ATTEMPTS + 1):
            response = super().handle_request(request)
            if response.status_code not in TRANSIENT and response.status_code != RATE_LIMITED:
                return response
            wait = (
                retry_after(response.headers.get("retry-after", "")) if response.status_code == RATE_LIMITED else None
            )
            wait = min(BACKOFF_S * 2 ** (attempt - 1) if wait is None else wait, MAX_WAIT_S)
            if attempt == ATTEMPTS or waited + wait > BUDGET_S:
                return response
            response.read()
            response.close()
            time.sleep(wait)
            waited += wait
        raise AssertionError("unreachable: the last attempt returns")
