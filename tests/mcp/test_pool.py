"""The worker's MCP connection pool against real servers: start on first use, reuse,
restart a dead server, evict idle ones, stop all at shutdown; streamable HTTP with a
`${VAR}` header (refloop's own /mcp endpoint as the server)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import uvicorn

from refloop.api.main import create_app
from refloop.mcp import pool as mcp_pool
from refloop.mcp.pool import McpPool, McpTransportError
from refloop.runtime.net import free_port, wait_for_port
from tests.workflow.test_mcp import server_pids

TIME = str(Path(sys.executable).parent / "mcp-server-time")


def pool_for(settings, tmp_path: Path, servers: dict) -> McpPool:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return McpPool(settings.model_copy(update={"refloop_mcp_config": str(path)}))


def workspaces(tmp_path: Path, n: int) -> list[str]:
    paths = []
    for i in range(n):
        (tmp_path / f"w{i}").mkdir()
        paths.append(str(tmp_path / f"w{i}"))
    return paths


async def test_started_once_restarted_when_dead_and_stopped_at_close(settings, tmp_path):
    pool = pool_for(settings, tmp_path, {"time": {"command": TIME}})
    [ws] = workspaces(tmp_path, 1)
    try:
        first = await pool.connection("time", ws)
        assert await pool.connection("time", ws) is first and pool.starts == 1
        assert {t.name for t in first.tools} == {"get_current_time", "convert_time"}
        for pid in server_pids(os.getpid(), "mcp-server-time"):
            # The sandbox's process and the server in it both match; killing the first
            # can end the second before it is reached.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for _ in range(50):  # the session notices its transport closed
            if not first.alive():
                break
            await asyncio.sleep(0.1)
        second = await pool.connection("time", ws)
        assert second is not first and pool.starts == 2
        result = await second.session.call_tool("get_current_time", {"timezone": "UTC"})
        assert not result.is_error
    finally:
        await pool.close()
    assert server_pids(os.getpid(), "mcp-server-time") == []


async def test_idle_and_excess_servers_are_stopped(settings, tmp_path, monkeypatch):
    monkeypatch.setattr(mcp_pool, "MAX_CONNECTIONS", 2)
    pool = pool_for(settings, tmp_path, {"time": {"command": TIME}})
    a, b, c = workspaces(tmp_path, 3)
    try:
        first = await pool.connection("time", a)
        await pool.connection("time", b)
        await pool.connection("time", c)  # over the cap: the least recently used goes
        assert first.closing.is_set() and len(pool._connections) == 2
        monkeypatch.setattr(mcp_pool, "IDLE_S", 0.0)
        await asyncio.sleep(0.01)
        await pool.connection("time", c)  # every other idle server stops
        assert list(pool._connections) == [("time", c)]
    finally:
        await pool.close()


async def test_a_server_that_cannot_start_is_a_transport_error(settings, tmp_path):
    pool = pool_for(settings, tmp_path, {"bad": {"command": "/bin/false"}})
    [ws] = workspaces(tmp_path, 1)
    with pytest.raises(McpTransportError, match="did not start"):
        await pool.connection("bad", ws)
    await pool.close()


async def test_streamable_http_server_with_a_header_from_the_environment(
        settings, tmp_path, monkeypatch):
    token = "http-t0ken"
    monkeypatch.setenv("REFLOOP_TEST_MCP_TOKEN", token)
    port = free_port()
    app = create_app(settings.model_copy(update={"refloop_api_token": token}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    serving = asyncio.create_task(server.serve())
    url = f"http://127.0.0.1:{port}/mcp"
    good = pool_for(settings, tmp_path, {"refloop": {
        "url": url, "headers": {"Authorization": "Bearer ${REFLOOP_TEST_MCP_TOKEN}"}}})
    (tmp_path / "bad").mkdir()
    bad = pool_for(settings, tmp_path / "bad", {"refloop": {"url": url}})
    try:
        await asyncio.to_thread(wait_for_port, port, 30, lambda: not serving.done())
        connection = await good.connection("refloop", str(tmp_path))
        assert "start_task" in {t.name for t in connection.tools}
        # No sandbox to bind a workspace into: one connection serves every workspace.
        assert await good.connection("refloop", str(tmp_path / "bad")) is connection
        with pytest.raises(McpTransportError):
            await bad.connection("refloop", str(tmp_path))
    finally:
        await good.close()
        await bad.close()
        server.should_exit = True
        await serving
