"""The mcpServers file, tool names for the model, `${VAR}` secrets and an MCP tool's
properties."""

from __future__ import annotations

import json
import re

import pytest

from refloop.contract.activity_io import ToolConstraints, ToolResult
from refloop.contract.errors import McpConfigError
from refloop.contract.mcp import McpToolInfo, mcp_tool_properties
from refloop.contract.messages import ToolCall
from refloop.mcp.config import (
    choose,
    load_config,
    model_schema,
    parse_server_list,
    resolved_env,
    resolved_headers,
    tool_name,
)
from refloop.workflows.approval_phase import needs_approval
from refloop.workflows.mcp_phase import with_mcp_reads
from refloop.workflows.triggers import anomaly_of

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def write(tmp_path, data) -> str:
    path = tmp_path / "mcp.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_loads_stdio_and_http_servers_with_options(tmp_path):
    config = load_config(write(tmp_path, {"mcpServers": {
        "git": {"command": "mcp-server-git", "args": ["--repository", "."],
                "env": {"TOKEN": "${GIT_TOKEN}"}, "confirm": ["git_commit"],
                "type": "stdio"},
        "docs": {"url": "https://example.com/mcp", "headers": {"Authorization":
                                                                "Bearer ${DOCS}"},
                 "tools": ["search"], "timeout_s": 5},
    }}))
    assert config.servers["git"].transport == "stdio"
    assert config.servers["docs"].transport == "http"
    assert config.servers["docs"].tools == ["search"]
    assert load_config(None).servers == {}


@pytest.mark.parametrize("body, message", [
    ("{not json", "not JSON"),
    ({"mcpServers": {"a": {}}}, "exactly one of"),
    ({"mcpServers": {"a": {"command": "x", "url": "http://h"}}}, "exactly one of"),
    ({"mcpServers": {"a": {"url": "file:///etc/passwd"}}}, "http:// or https://"),
    ({"mcpServers": {"a__b": {"command": "x"}}}, "server name"),
    ({"mcpServers": {"../x": {"command": "x"}}}, "server name"),
    ({"mcpServers": {"a": {"command": "x", "timeout_s": -1}}}, "timeout_s"),
    ({"servers": {}}, "mcpServers"),
])
def test_bad_files_are_refused_naming_the_problem(tmp_path, body, message):
    with pytest.raises(McpConfigError, match=re.escape(message)):
        load_config(write(tmp_path, body))


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(McpConfigError, match="No such file"):
        load_config(str(tmp_path / "nope.json"))


def test_error_messages_never_show_secret_values(tmp_path):
    path = write(tmp_path, {"mcpServers": {"a": {"command": "x", "env": {"K": "hunter2"},
                                                 "timeout_s": "hunter2"}}})
    with pytest.raises(McpConfigError) as err:
        load_config(path)
    assert "hunter2" not in str(err.value)


def test_variables_resolve_from_the_workers_environment_only(tmp_path):
    config = load_config(write(tmp_path, {"mcpServers": {"s": {
        "url": "https://h/mcp", "headers": {"Authorization": "Bearer ${TOKEN}", "X": "$TOKEN"},
    }, "t": {"command": "x", "env": {"A": "${A}-${B}"}}}}))
    assert resolved_headers("s", config.servers["s"], {"TOKEN": "abc"}) == {
        "Authorization": "Bearer abc", "X": "$TOKEN"}
    assert resolved_env("t", config.servers["t"], {"A": "1", "B": "2"}) == {"A": "1-2"}
    with pytest.raises(McpConfigError, match=r"\$\{B\}, which is not set") as err:
        resolved_env("t", config.servers["t"], {"A": "secret-a"})
    assert "secret-a" not in str(err.value)


def test_a_task_chooses_known_servers_only(tmp_path):
    config = load_config(write(tmp_path, {"mcpServers": {"git": {"command": "g"},
                                                         "time": {"command": "t"}}}))
    assert list(choose(config, ["time", "git", "time"])) == ["time", "git"]
    with pytest.raises(McpConfigError, match="unknown MCP server.*nosuch; known: git, time"):
        choose(config, ["git", "nosuch"])
    assert parse_server_list(" git, time,,git ") == ["git", "time"]
    assert parse_server_list(None) == []


def test_tool_names_fit_the_function_name_rules():
    assert tool_name("git", "git_status") == "git__git_status"
    odd = tool_name("fs", "read.file/v2")
    assert FUNCTION_NAME.match(odd) and odd.startswith("fs__read_file_v2_")
    long = tool_name("server", "x" * 200)
    assert FUNCTION_NAME.match(long) and len(long) == 64
    assert tool_name("server", "y" * 200) != long
    # Two tools that clean to the same name stay distinct.
    first = tool_name("s", "a.b")
    second = tool_name("s", "a_b", {first, "s__a_b"})
    assert first != second and FUNCTION_NAME.match(second)


def test_schemas_pass_through_apart_from_the_required_object_shape():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}},
              "required": ["x"], "$defs": {"y": {}}, "additionalProperties": False}
    assert model_schema(schema) == schema
    assert model_schema(None) == {"type": "object", "properties": {}}
    assert model_schema({"type": "object"}) == {"type": "object", "properties": {}}


def tool(confirm: bool) -> McpToolInfo:
    """git_commit under `confirm`; git_log annotated as mcp-server-git does (readOnlyHint)."""
    return McpToolInfo(name="git__git_commit" if confirm else "git__git_log", server="git",
                       tool="git_commit" if confirm else "git_log", confirm=confirm,
                       read_only=None if confirm else True)


def test_properties_drive_approval_triggers_and_constraints():
    write_tool, read_tool = mcp_tool_properties(tool(True)), mcp_tool_properties(tool(False))
    assert write_tool.kind == "write" and read_tool.kind == "read"
    commit = ToolCall(id="1", name="git__git_commit")
    log = ToolCall(id="2", name="git__git_log")
    # confirm tools wait in every mode; other MCP tools follow the mode like reads.
    assert needs_approval("auto", commit, write_tool)
    assert needs_approval("confirm_writes", commit, write_tool)
    assert not needs_approval("auto", log, read_tool)
    assert not needs_approval("confirm_writes", log, read_tool)
    assert needs_approval("confirm_all", log, read_tool)
    # An empty result of an MCP read is an anomaly, like an empty read_file.
    assert anomaly_of(ToolResult(ok=True, output=""), read_tool) == "empty result"
    assert anomaly_of(ToolResult(ok=True, output=""), write_tool) is None
    # Outputs are windowed; nothing an MCP tool returns is quality-reviewed.
    assert write_tool.windowed and read_tool.windowed
    assert not write_tool.reviewed and not read_tool.reviewed
    # Read-only MCP tools are allowed where a task type lists allowed tools.
    research = ToolConstraints(task_type="research", allowed=["read_file"],
                               forbidden=["git__git_commit"])
    widened = with_mcp_reads(research, ["git__git_log"])
    assert widened.allowed == ["git__git_log", "read_file"]
    assert widened.forbidden == ["git__git_commit"]
    assert with_mcp_reads(ToolConstraints(), ["git__git_log"]).allowed == []


def test_stdio_launch_is_sandboxed_with_network_only_when_allowed(tmp_path, monkeypatch):
    from refloop.mcp.config import McpServerConfig
    from refloop.mcp.pool import launch_spec
    from refloop.settings import Settings
    from refloop.tools.os_sandbox import sandbox_mode

    settings = Settings(refloop_data_dir=tmp_path / "data")
    if sandbox_mode(settings) != "bwrap":
        pytest.skip("bubblewrap cannot run here")
    config = McpServerConfig(command="true", args=["--x"], env={"TOKEN": "${T}"})
    spec = launch_spec("s", config, tmp_path, settings, {"T": "tok"})
    assert spec.sandboxed and spec.argv[-2:] == ["/usr/bin/true", "--x"]
    # The per-command CPU cap would end a pooled server: a server gets none in practice.
    cpu = [arg for arg in spec.argv if arg.startswith("--cpu=")]
    assert cpu == [] or int(cpu[0].split("=")[1]) >= 10**8
    assert "--share-net" not in spec.argv and spec.env["TOKEN"] == "tok"
    assert ["--bind", str(tmp_path), str(tmp_path)] == spec.argv[
        spec.argv.index("--bind"):spec.argv.index("--bind") + 3]
    networked = config.model_copy(update={"network": True})
    assert "--share-net" in launch_spec("s", networked, tmp_path, settings, {"T": "t"}).argv
    unconfined = settings.model_copy(update={"refloop_sandbox": "none"})
    plain = launch_spec("s", config, tmp_path, unconfined, {"T": "t"})
    assert not plain.sandboxed and plain.argv[-2:] == ["/usr/bin/true", "--x"]
    assert "bwrap" not in " ".join(plain.argv)
