"""What every real-server module of the test infrastructure shares: a skip (a failure in CI) for a
part that cannot be had, bounded waits, names no other test uses, and a plain HTTP GET for
readiness probes."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import NoReturn

import pytest

REQUIRE_REAL_ENV = "MEDALLION_TEST_REQUIRE_REAL"


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """Status and body of a GET; any connection error surfaces as an ``OSError``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        # 503 "not ready yet" is an answer, not a connection failure: callers poll on it.
        return int(exc.code), exc.read()


def require_or_skip(reason: str) -> NoReturn:
    """Skip a test whose real part is missing; fail instead in CI, where every real part must run.

    CI sets ``MEDALLION_TEST_REQUIRE_REAL=1`` so that a broken install shows up as a red build rather
    than as a quietly growing number of skips.
    """
    if os.environ.get(REQUIRE_REAL_ENV, "") == "1":
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def unique_name(prefix: str) -> str:
    """A topic/group name no other test uses: the session-scoped broker is shared by all tests."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    """Poll ``condition`` until truthy; returns the seconds it took, fails the test after ``timeout_s``.

    Every wait in an integration test needs a bound, and the message should say what never happened.
    """
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout_s:
            pytest.fail(f"{what}: not within {timeout_s}s")
        time.sleep(interval_s)
    return time.monotonic() - t0
