"""Local ports for the embedded servers (Temporal, the scripted model)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Block until something listens on 127.0.0.1:port; fail if `alive()` turns false."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"the server for port {port} exited before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listened on port {port} within {timeout_s:.0f}s")
