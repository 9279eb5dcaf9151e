"""MCP tool servers: the `mcpServers` file, tool names for the model, a tool's properties.

Plain data and pure functions: the workflow imports the models, the worker's pool reads the
file. `${VAR}` in `env` and `headers` is resolved from the worker's environment only, by
`resolved_env` / `resolved_headers`, when a server is started: secrets never enter a
workflow input, an activity input or a result.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from refloop.contract.errors import McpConfigError

SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
# The OpenAI function-name rule: what every chat-completions server accepts.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_NAME = 64
SEPARATOR = "__"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class McpToolOverride(BaseModel):
    """The operator's word on one tool, over the server's annotations (None: keep theirs)."""

    model_config = ConfigDict(extra="forbid")

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None


class McpServerConfig(BaseModel):
    """One entry of `mcpServers`: stdio (`command`) or streamable HTTP (`url`)."""

    model_config = ConfigDict(extra="ignore")  # other clients' keys (`type`, `disabled`)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tools: list[str] | None = None  # allow list; None: every tool the server lists
    confirm: list[str] = Field(default_factory=list)  # need a human's approval
    # destructive (or unannotated) tools that may run without a yes in `auto` mode
    unattended: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    network: bool = False  # a stdio server may reach the network (its sandbox)
    # tool -> properties that replace the server's annotations (readOnlyHint...)
    properties: dict[str, McpToolOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("give exactly one of `command` (stdio) or `url` (streamable HTTP)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError("`url` must be http:// or https://")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command else "http"


class McpConfig(BaseModel):
    servers: dict[str, McpServerConfig] = Field(alias="mcpServers")

    @model_validator(mode="after")
    def _names(self) -> McpConfig:
        for name in self.servers:
            if not SERVER_NAME.match(name) or SEPARATOR in name:
                raise ValueError(f"server name {name!r}: letters, digits, _ and - (at most "
                                 f"32, no '{SEPARATOR}')")
        return self


def load_config(path: str | Path | None) -> McpConfig:
    """The file `REFLOOP_MCP_CONFIG` names; no file: no servers. A bad file names the problem
    (never a value: env and headers may hold secrets)."""
    if not path:
        return McpConfig(mcpServers={})
    source = Path(path)
    try:
        raw = json.loads(source.read_text(encoding="utf-8"))
        return McpConfig.model_validate(raw)
    except OSError as err:
        raise McpConfigError(f"MCP config {source}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise McpConfigError(f"MCP config {source}: not JSON ({err.msg}, line {err.lineno})"
                             ) from None
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in err.errors())
        raise McpConfigError(f"MCP config {source}: {problems}") from None


def choose(config: McpConfig, names: list[str]) -> dict[str, McpServerConfig]:
    """The servers a task chose, in its order; an unknown name is refused."""
    unknown = [name for name in names if name not in config.servers]
    if unknown:
        known = ", ".join(sorted(config.servers)) or "none configured"
        raise McpConfigError(f"unknown MCP server(s) {', '.join(unknown)}; known: {known}")
    return {name: config.servers[name] for name in dict.fromkeys(names)}


def parse_server_list(value: str | list[str] | None) -> list[str]:
    """`git,time` or a list: names, stripped, unique, in order."""
    items = value.split(",") if isinstance(value, str) else (value or [])
    return list(dict.fromkeys(item.strip() for item in items if item and item.strip()))


def _substitute(value: str, environ: Mapping[str, str], where: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise McpConfigError(f"{where} references ${{{name}}}, which is not set "
                                 "in the worker's environment")
        return environ[name]

    return _VAR.sub(one, value)


def resolved_env(server: str, config: McpServerConfig,
                 environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {key: _substitute(value, environ, f"mcpServers.{server}.env.{key}")
            for key, value in config.env.items()}


def resolved_headers(server: str, config: McpServerConfig,
                     environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {key: _substitute(value, environ, f"mcpServers.{server}.headers.{key}")
            for key, value in config.headers.items()}


def tool_name(server: str, tool: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """`server__tool` within the function-name charset and length; a name that had to be
    changed (other characters, too long, a clash) ends in a short hash of the original."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", tool)
    name = f"{server}{SEPARATOR}{cleaned}"
    if name != f"{server}{SEPARATOR}{tool}" or len(name) > MAX_NAME or name in taken:
        suffix = hashlib.sha256(f"{server}/{tool}".encode()).hexdigest()[:8]
        name = f"{name[:MAX_NAME - 9]}_{suffix}"
    return name


def model_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The server's input schema as is, apart from what the model API requires: an object
    schema at the top (`type: object`, `properties`)."""
    schema = dict(schema or {})
    schema.setdefault("type", "object")
    if schema["type"] == "object":
        schema.setdefault("properties", {})
    return schema
