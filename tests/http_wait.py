"""Waiting for a server a test started in its own process."""

from __future__ import annotations

import time

import httpx


def wait_until_healthy(base_url: str, timeout_s: float = 60.0) -> None:
    """Poll `{base_url}/healthz` until it answers 200; fail the test if it never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{base_url} did not become healthy within {timeout_s:.0f}s")
