"""refloop as an MCP server, driven by the `mcp` package's own client: `refloop mcp` over
stdio (a real subprocess) and `/mcp` on the API over streamable HTTP (a real uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from refloop.api.main import create_app
from refloop.runtime.net import free_port, wait_for_port
from refloop.worker.main import build_worker
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of

TOOLS = {"start_task", "get_task", "task_events", "approve", "cancel_task",
         "start_code_review", "get_code_review"}


def payload(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        inner = result.structured_content
        return inner.get("result", inner) if set(inner) == {"result"} else inner
    return json.loads(result.content[0].text)


async def drive_a_task(session: ClientSession, scripted_llm, workspace) -> None:
    """Start a scripted task that writes a file under confirm_writes, read its events,
    approve the write, get the result."""
    listed = {tool.name for tool in (await session.list_tools()).tools}
    assert listed >= TOOLS
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="r.md", content="# R\n"), final("written")],
        "summary": [SUMMARY]})
    started = payload(await session.call_tool("start_task", {
        "task": "write r.md", "workspace": str(workspace), "model": model,
        "approval_mode": "confirm_writes"}))
    task_id = started["task_id"]
    seen, waiting, ended = 0, None, False
    for _ in range(200):
        page = payload(await session.call_tool("task_events", {
            "task_id": task_id, "after_seq": seen, "wait_s": 2}))
        for event in page["events"]:
            assert event["seq"] > seen  # no duplicates, in order
            seen = event["seq"]
            if event["type"] == "approval_required":
                waiting = event["data"]["call_id"]
        if waiting:
            decided = payload(await session.call_tool("approve", {
                "task_id": task_id, "call_id": waiting, "approved": True}))
            assert decided["outcome"] == "approved"
            waiting = None
        if page["ended"]:
            ended = True
            break
    assert ended
    state = payload(await session.call_tool("get_task", {"task_id": task_id}))
    assert state["status"] == "completed" and state["result"]["answer"] == "written"
    assert "events" not in state["result"]
    assert (workspace / "r.md").read_text() == "# R\n"
    # Refusals come back as tool errors with the API's message.
    missing = await session.call_tool("get_task", {"task_id": "task-nope"})
    assert missing.is_error and "404" in missing.content[0].text
    again = await session.call_tool("approve", {"task_id": task_id, "call_id": "1.0"})
    assert again.is_error and "409" in again.content[0].text


@pytest.fixture
def mcp_settings(settings, task_queue):
    return settings.model_copy(update={"refloop_task_queue": task_queue,
                                       "enable_reflection": False})


async def test_refloop_mcp_over_stdio(client, temporal_server, mcp_settings, scripted_llm,
                                      workspace, task_queue):
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server, "REFLOOP_TASK_QUEUE": task_queue,
           "OPENAI_BASE_URL": mcp_settings.openai_base_url, "OPENAI_API_KEY": "test",
           "ENABLE_REFLECTION": "false",  # as the worker's settings: no completeness check
           "DATABASE_URL": mcp_settings.database_url,
           "REFLOOP_DATA_DIR": str(mcp_settings.refloop_data_dir),
           "REFLOOP_WORKSPACE_ROOTS": str(workspace.parent)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "refloop", "mcp"],
                                   env=env)
    async with build_worker(client, mcp_settings, task_queue), stdio_client(params) as (
            read, write), ClientSession(read, write) as session:
        await session.initialize()
        await drive_a_task(session, scripted_llm, workspace)


@contextlib.asynccontextmanager
async def serving(settings, client) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, client=client),
                                           host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        await asyncio.to_thread(wait_for_port, port, 30, lambda: not task.done())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    http = create_mcp_http_client(headers=headers)
    async with http, streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def test_mcp_over_http_behind_the_api_token(client, mcp_settings, scripted_llm,
                                                  workspace, task_queue):
    settings = mcp_settings.model_copy(update={"refloop_api_token": "t0ken-mcp"})
    async with build_worker(client, settings, task_queue), serving(settings, client) as url:
        async with http_session(url, "t0ken-mcp") as session:
            await drive_a_task(session, scripted_llm, workspace)
        for token in (None, "wrong"):
            # The mcp client cannot even initialize...
            with pytest.raises(BaseException):  # noqa: B017 (an ExceptionGroup from anyio)
                async with http_session(url, token):
                    pass
            # ...because every request is answered 401 before it reaches the MCP server.
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with httpx.AsyncClient() as http:
                response = await http.post(url, headers={
                    **headers, "Accept": "application/json, text/event-stream"},
                    json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"


async def test_mcp_over_http_without_a_token_serves_localhost(client, mcp_settings,
                                                               task_queue):
    async with serving(mcp_settings, client) as url, http_session(url) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed >= TOOLS
        refused = await session.call_tool("start_task", {"task": "x",
                                                         "workspace": "/no/such/dir"})
        # outside the workspace roots: refused before the filesystem is even looked at
        assert refused.is_error and "REFLOOP_WORKSPACE_ROOTS" in refused.content[0].text


async def test_api_tasks_choose_mcp_servers_with_a_session_default(
        client, mcp_settings, workspace, task_queue, tmp_path):
    from refloop.store.db import store_for

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": {
        "command": os.path.join(os.path.dirname(sys.executable), "mcp-server-time")}}}))
    settings = mcp_settings.model_copy(update={"refloop_mcp_config": str(config)})
    store = store_for(settings.effective_database_url)
    app = create_app(settings, client=client)
    async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost") as api:
        async def session_with(**body) -> str:
            response = await api.post("/agent/interactive/start",
                                      json={"workspace": str(workspace), **body})
            assert response.status_code == 201, response.text
            return response.json()["session_id"]

        async def task(session: str, **body) -> httpx.Response:
            return await api.post("/agent/interactive/task", json={
                "session_id": session, "task": "what time is it", **body})

        default = await session_with(mcp_servers=["time"])
        inherited = await task(default)
        assert inherited.status_code == 202, inherited.text
        row = store.get_task(inherited.json()["task_id"])
        assert row.input["mcp_servers"] == ["time"]
        overridden = await task(default, mcp_servers=[])
        assert store.get_task(overridden.json()["task_id"]).input["mcp_servers"] == []
        plain = await task(await session_with())
        assert store.get_task(plain.json()["task_id"]).input["mcp_servers"] == []
        unknown = await task(default, mcp_servers=["nosuch"])
        assert unknown.status_code == 422 and "nosuch" in unknown.text
        hostile = await task(default, mcp_servers=["../etc"])
        assert hostile.status_code == 422
        too_many = await task(default, mcp_servers=[f"s{n}" for n in range(17)])
        assert too_many.status_code == 422
        refused = await api.post("/agent/interactive/start", json={
            "workspace": str(workspace), "mcp_servers": ["nosuch"]})
        assert refused.status_code == 422 and "known: time" in refused.text
        for accepted in (inherited, overridden, plain):
            await client.get_workflow_handle(accepted.json()["task_id"]).terminate()


async def test_mcp_refusals_say_why_as_http_does(temporal_server, mcp_settings, workspace,
                                                 task_queue):
    """`refloop mcp`, driven by the MCP Inspector, said only "Error executing tool"; it took
    NUL bytes and relative workspaces, and echoed a huge ID whole."""
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server, "REFLOOP_TASK_QUEUE": task_queue,
           "DATABASE_URL": mcp_settings.database_url,
           "REFLOOP_DATA_DIR": str(mcp_settings.refloop_data_dir),
           "REFLOOP_WORKSPACE_ROOTS": str(workspace.parent)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "refloop", "mcp"],
                                   env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()

        async def refusal(tool: str, **arguments) -> str:
            result = await session.call_tool(tool, arguments)
            assert result.is_error, result
            return result.content[0].text

        text = await refusal("start_task", task="a\x00b", workspace=str(workspace))
        assert "422" in text and "NUL bytes" in text
        text = await refusal("start_task", task="x", workspace="relative/dir")
        assert "422" in text and "absolute path" in text
        text = await refusal("start_task", task="x", workspace=str(workspace),
                             max_iterations=0)
        assert "422" in text and "greater than or equal to 1" in text
        text = await refusal("get_task", task_id="x" * 200_000)
        assert "422" in text and len(text) < 300
        text = await refusal("get_code_review", task_id="../../etc")
        assert "422" in text
