"""The schema names the configured MCP servers where a request names one (a session's
default servers, a task's), as it names the bound model keys: a list the document allows is
one the routes accept, and a name outside it is refused by both. Read with the MCP file, so
an operator's edit shows without a restart; none configured (or a file that does not load):
an empty list only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from refloop.api.main import create_app
from refloop.settings import Settings


def server_lists(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each request body's `mcp_servers` schema, by component."""
    schemas = spec["components"]["schemas"]
    return {name: schemas[name]["properties"]["mcp_servers"]
            for name in ("SessionStart", "TaskCreate")}


def allows(schema: dict[str, Any], value: Any) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def write_config(path: Path, *names: str) -> None:
    path.write_text(json.dumps({"mcpServers": {name: {"command": "true"} for name in names}}))


@pytest.fixture
def configured(settings: Settings, tmp_path: Path) -> tuple[Settings, Path]:
    config = tmp_path / "mcp.json"
    write_config(config, "time", "git")
    return settings.model_copy(update={"refloop_mcp_config": str(config),
                                       "refloop_workspace_roots": str(tmp_path)}), config


async def test_the_document_names_the_configured_servers_and_the_routes_agree(configured,
                                                                              tmp_path):
    settings, config = configured
    app = create_app(settings, client=None)
    for name, schema in server_lists(app.openapi()).items():
        assert allows(schema, ["time"]) and allows(schema, ["git", "time"]), name
        assert not allows(schema, ["nosuch"]) and not allows(schema, ["../etc"]), name
        assert "REFLOOP_MCP_CONFIG" in schema["description"]
    assert allows(server_lists(app.openapi())["TaskCreate"], None)  # the session's

    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as api:
        for servers, expected in ((["time", "git"], 201), ([], 201), (["nosuch"], 422)):
            response = await api.post("/agent/interactive/start", json={
                "workspace": str(workspace), "mcp_servers": servers})
            assert response.status_code == expected, response.text

        write_config(config, "time", "git", "fetch")  # the operator adds one: no restart
        session_start = server_lists(app.openapi())["SessionStart"]
        assert allows(session_start, ["fetch"])
        response = await api.post("/agent/interactive/start", json={
            "workspace": str(workspace), "mcp_servers": ["fetch"]})
        assert response.status_code == 201, response.text
        served = (await api.get("/openapi.json")).json()
        assert allows(server_lists(served)["TaskCreate"], ["fetch"])


@pytest.mark.parametrize("config_text", [None, "{not json"])
async def test_without_a_usable_config_only_an_empty_list_is_allowed(settings, tmp_path,
                                                                     config_text):
    config = tmp_path / "mcp.json"
    if config_text is not None:
        config.write_text(config_text)
    settings = settings.model_copy(update={
        "refloop_mcp_config": str(config) if config_text is not None else None,
        "refloop_workspace_roots": str(tmp_path)})
    app = create_app(settings, client=None)
    for name, schema in server_lists(app.openapi()).items():
        assert allows(schema, []) and not allows(schema, ["time"]), name
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as api:
        response = await api.post("/agent/interactive/start", json={
            "workspace": str(workspace), "mcp_servers": ["time"]})
        assert response.status_code == 422, response.text
