"""SIGTERM always ends `refloop up` within the grace period + 5 s, whatever it is doing:
here a model call that never answers is in flight (the worker drains it for the grace
period), 60 event streams are open on its task, and a `refloop mcp` is attached to the same
Temporal server. The watchdog is armed at the signal itself, also while uvicorn holds the
signal (it armed nothing until uvicorn's own shutdown had ended)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_up_restart import Up

pytestmark = pytest.mark.slow
GRACE_S = 2.0


def silent_model() -> tuple[str, socket.socket]:
    """A model endpoint that accepts connections and never answers a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/v1", listener


async def test_sigterm_ends_up_within_grace_plus_five_under_load(tmp_path: Path):
    url, listener = silent_model()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    up = Up(tmp_path, url, REFLOOP_GRACEFUL_SHUTDOWN_S=str(GRACE_S),
            REFLOOP_LLM_TIMEOUT_S="600", REFLOOP_WORKSPACE_ROOTS=str(tmp_path))
    mcp = None
    try:
        await asyncio.to_thread(up.start)
        base = f"http://127.0.0.1:{up.api_port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            session = (await http.post("/agent/interactive/start", json={
                "workspace": str(workspace)})).json()["session_id"]
            task = (await http.post("/agent/interactive/task", json={
                "session_id": session, "task": "write a.txt"})).json()["task_id"]
            mcp_env = {**up.env, "TEMPORAL_ADDRESS": up.address}
            mcp = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
                [sys.executable, "-m", "refloop", "mcp"], env=mcp_env,
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)

            async def stream() -> None:
                async with http.stream("GET", f"/tasks/{task}/events") as response:
                    async for _ in response.aiter_bytes():
                        pass

            streams = [asyncio.create_task(stream()) for _ in range(60)]
            await asyncio.sleep(3)  # the model call is in flight, the streams open
            assert up.process is not None and up.process.poll() is None
            began = time.monotonic()
            up.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(up.process.wait, 60)
            took = time.monotonic() - began
            for one in streams:
                one.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
        assert code == 143, up.log.read_text()[-3000:]
        assert took <= GRACE_S + 5, (took, up.log.read_text()[-3000:])
    finally:
        listener.close()
        if mcp is not None:
            mcp.kill()
            mcp.wait()
        up.cleanup()
