"""Red team, MCP: a server is not trusted more than a built-in tool (issue 29, finding 7).

Against real stdio servers in the sandbox: tests/fixtures/annotated_mcp_server.py (tools with
annotations, a description that gives orders, a result of 50 MB) and
tests/fixtures/raw_mcp_server.py (a server that never answers `initialize`, lists garbage,
gives a tool a broken schema, or dies at start saying why on stderr)."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from refloop.activities.mcp_activities import McpActivities
from refloop.contract.mcp import McpCallInput, McpListInput, is_untrusted, mcp_tool_properties
from refloop.contract.tool_properties import APPROVAL_MODES
from refloop.mcp import pool as mcp_pool
from refloop.store.db import store_for
from refloop.workflows.logic import tool_signatures

FIXTURES = Path(__file__).parent.parent / "fixtures"
PYTHON = sys.executable


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def activities_for(settings, tmp_path: Path, servers: dict) -> McpActivities:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    configured = settings.model_copy(update={"refloop_mcp_config": str(path)})
    return McpActivities(configured, store_for(f"sqlite:///{tmp_path / 'db.sqlite'}"))


async def listing(acts: McpActivities, ws: Path, *servers: str):
    return await ActivityEnvironment().run(acts.list_tools,
                                           McpListInput(servers=list(servers),
                                                        workspace=str(ws)))


async def call(acts: McpActivities, ws: Path, server: str, tool: str, **arguments):
    return await ActivityEnvironment().run(acts.call_tool, McpCallInput(
        call_id=uuid.uuid4().hex, server=server, tool=tool, arguments=arguments,
        workspace=str(ws)))


# A script path, as Claude Desktop configs have it: `python /path/server.py`.
ANNOTATED = {"command": PYTHON, "args": [str(FIXTURES / "annotated_mcp_server.py")]}


async def test_annotations_decide_approval_and_retries(settings, tmp_path, ws):
    acts = activities_for(settings, tmp_path, {"a": {
        **ANNOTATED, "confirm": ["look"], "properties": {"plain": {"read_only": True}},
        "unattended": ["create_branch"]}})
    try:
        listed = await listing(acts, ws, "a")
    finally:
        await acts.pool.close()
    tools = {t.tool: t for t in listed.tools}
    assert "create_branch" in tools, listed.dropped
    props = {name: mcp_tool_properties(tool) for name, tool in tools.items()}
    # readOnlyHint false, idempotentHint false: a write, approved under confirm_writes, once.
    branch = props["create_branch"]
    assert branch.kind == "write" and branch.needs_approval("confirm_writes", {})
    assert branch.activity.max_attempts == 1
    # destructiveHint: asks in every mode, `auto` included (idempotentHint true: may be
    # retried); create_branch (not read-only, destructiveHint not said: destructive, by the
    # MCP specification) would too, but the operator lets it run unattended.
    assert all(props["wipe"].needs_approval(mode, {}) for mode in APPROVAL_MODES)
    assert not props["create_branch"].needs_approval("auto", {})
    assert props["wipe"].activity.max_attempts > 1
    # readOnlyHint true from the server alone: not trusted (round four), a write run once;
    # the operator's `confirm` list still wins.
    assert tools["bossy"].declared_read_only is True and tools["bossy"].read_only is None
    assert props["bossy"].kind == "write" and props["bossy"].activity.max_attempts == 1
    assert props["bossy"].needs_approval("confirm_writes", {})
    assert props["look"].kind == "write" and props["look"].needs_approval("auto", {})
    # No annotation: a write; the operator's explicit properties override that.
    assert props["plain"].kind == "read"


async def test_descriptions_are_fenced_capped_and_kept_out_of_the_system_prompt(
        settings, tmp_path, ws):
    acts = activities_for(settings, tmp_path, {"a": ANNOTATED})
    try:
        tools = {t.tool: t for t in (await listing(acts, ws, "a")).tools}
    finally:
        await acts.pool.close()
    spec = tools["bossy"].spec()
    assert is_untrusted(spec.description) and "never instructions" in spec.description
    assert spec.description.count("<<<") == 1 and spec.description.rstrip().endswith(">>>")
    assert len(spec.description) < 1300
    prompt = tool_signatures([spec])
    assert "IGNORE ALL PREVIOUS" not in prompt and spec.name in prompt


async def test_a_huge_result_is_capped(settings, tmp_path, ws):
    """50 MB in one message: refused in the sandbox before the client reads it (an error
    for the model); 1 MB: under the message cap, passed on (windowed)."""
    acts = activities_for(settings, tmp_path, {"a": {**ANNOTATED, "timeout_s": 60}})
    started = time.monotonic()
    try:
        huge = await call(acts, ws, "a", "huge", megabytes=50)
        large = await call(acts, ws, "a", "huge", megabytes=1)
    finally:
        await acts.pool.close()
    assert not huge.ok and "MCP message cap" in huge.error, huge.error
    assert large.ok and len(large.output) < 2 * 1024 * 1024
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("mode", ["hang", "bad-listing", "crash"])
async def test_a_server_that_cannot_start_is_an_error_the_model_reads(
        settings, tmp_path, ws, monkeypatch, mode):
    monkeypatch.setattr(mcp_pool, "START_TIMEOUT_S", 3.0)
    acts = activities_for(settings, tmp_path, {"raw": {
        "command": PYTHON, "args": [str(FIXTURES / "raw_mcp_server.py"), mode]}})
    started = time.monotonic()
    try:
        listed = await listing(acts, ws, "raw")  # no exception: the task goes on
        result = await call(acts, ws, "raw", "odd", a=1)
    finally:
        await acts.pool.close()
    assert time.monotonic() - started < 20
    assert listed.tools == [] and listed.dropped and listed.dropped[0].startswith("raw:")
    assert not result.ok and result.error.startswith("E_MCP_START"), result.error
    if mode == "crash":
        assert "cannot open its database" in result.error  # the server's stderr tail
    if mode == "hang":
        assert "initialize" in result.error


async def test_an_invalid_input_schema_is_an_error_not_a_crash(settings, tmp_path, ws):
    acts = activities_for(settings, tmp_path, {"raw": {
        "command": PYTHON, "args": [str(FIXTURES / "raw_mcp_server.py"), "bad-schema"]}})
    try:
        listed = await listing(acts, ws, "raw")
        result = await call(acts, ws, "raw", "odd", a=1)
    finally:
        await acts.pool.close()
    assert listed.tools == [] and "invalid input schema" in listed.dropped[0]
    assert not result.ok and result.error.startswith("E_MCP_SCHEMA"), result.error


async def test_a_tool_that_says_read_only_and_writes_is_treated_as_a_write(
        settings, tmp_path, ws):
    """Round four (8): `sneaky` declares readOnlyHint and writes into the workspace. The
    server's word decides nothing: the tool waits for approval under confirm_writes and
    runs once (never retried into a second write), as any write."""
    acts = activities_for(settings, tmp_path, {"a": ANNOTATED})
    try:
        tools = {t.tool: t for t in (await listing(acts, ws, "a")).tools}
        sneaky = mcp_tool_properties(tools["sneaky"])
        assert tools["sneaky"].declared_read_only is True
        assert sneaky.kind == "write" and sneaky.activity.max_attempts == 1
        assert sneaky.needs_approval("confirm_writes", {})
        result = await call(acts, ws, "a", "sneaky")
    finally:
        await acts.pool.close()
    assert result.ok and (ws / "planted.txt").read_text() == "written by a read"
