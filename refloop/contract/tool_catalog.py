"""The tools as workflows and the model see them: each tool's name, description, argument
model (its JSON schema) and properties. Plain data: the implementations (`refloop.tools`)
register against these names, so workflow code never imports them. The built-ins are
declared here; a tool added in its own module declares itself with `refloop.tools.base.tool`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from refloop.contract.messages import COMPLETE_STEP, ToolSpec
from refloop.contract.tool_properties import (
    CONTROL,
    TOOL_ACTIVITY,
    ToolActivityOptions,
    ToolProperties,
)


class PathArgs(BaseModel):
    path: str = Field(description="path relative to the workspace")


class ReadFileArgs(BaseModel):
    path: str
    start_line: int | None = Field(default=None, ge=1, description="1-based, inclusive")
    end_line: int | None = Field(default=None, ge=1, description="1-based, inclusive")


class GlobArgs(BaseModel):
    pattern: str = Field(description="glob such as **/*.py")


class GrepArgs(BaseModel):
    pattern: str = Field(description="regular expression (RE2 syntax: no lookaround or "
                         "backreferences)")
    path: str = "."
    glob: str | None = Field(default=None, description="only files matching this glob")


class WriteFileArgs(BaseModel):
    path: str
    content: str


class RunCmdArgs(BaseModel):
    command: str = Field(min_length=1)
    timeout_s: float | None = Field(default=None, gt=0)


class EditArgs(BaseModel):
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"]
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = Field(default=None, ge=0)
    view_range: list[int] | None = Field(default=None, min_length=2, max_length=2)


class JsonEditArgs(BaseModel):
    operation: Literal["view", "set", "add", "remove"]
    file_path: str
    json_path: str | None = None
    value: Any = None


class PatchArgs(BaseModel):
    patch: str = Field(description="a unified diff (--- a/x, +++ b/x, @@ hunks)")


class UndoPatchArgs(BaseModel):
    patch_id: str | None = Field(default=None, description="default: the latest patch")


class SemanticSearchArgs(BaseModel):
    query: str = Field(min_length=1, description="what the code does, in plain words")
    limit: int = Field(default=5, ge=1, le=20)


@dataclass(frozen=True)
class ToolDeclaration:
    name: str
    description: str
    args: type[BaseModel]
    properties: ToolProperties

    def spec(self) -> ToolSpec:
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)


def _declare(name: str, args: type[BaseModel], description: str,
             properties: ToolProperties) -> tuple[str, ToolDeclaration]:
    if properties.kind == "control":
        raise ValueError(f"tool {name!r}: control tools are the workflow's own")
    return name, ToolDeclaration(name, description, args, properties)


def declare(name: str, args: type[BaseModel], description: str,
            properties: ToolProperties) -> ToolDeclaration:
    """Add a tool to the catalogue (a tool module's own declaration)."""
    TOOLS[name] = declaration = _declare(name, args, description, properties)[1]
    return declaration


# Every tool, in the order the model sees them: the built-ins, then declared ones.
TOOLS: dict[str, ToolDeclaration] = dict([
    _declare("run_cmd", RunCmdArgs,
             "Run a shell command in the workspace (sandboxed, timed out).",
             ToolProperties(kind="execute")),
    _declare("str_replace_based_edit_tool", EditArgs,
             "View, create and edit files: view | create | str_replace | insert | undo_edit.",
             ToolProperties(kind="write", journaled=True, command_arg="command",
                            read_commands=frozenset({"view"}),
                            unreviewed_commands=frozenset({"undo_edit"}))),
    _declare("list_dir", PathArgs, "List a directory of the workspace.",
             ToolProperties(kind="read", expects_output=False)),
    _declare("read_file", ReadFileArgs, "Read a text file, optionally a 1-based line range.",
             ToolProperties(kind="read")),
    _declare("glob_file_search", GlobArgs, "Find files by glob pattern, e.g. **/*.md.",
             ToolProperties(kind="read")),
    _declare("grep", GrepArgs, "Search file contents with a regular expression.",
             ToolProperties(kind="read")),
    _declare("write_file", WriteFileArgs, "Create or overwrite a text file.",
             ToolProperties(kind="write", journaled=True, generates=True)),
    _declare("json_edit_tool", JsonEditArgs,
             "View or edit a JSON file by JSONPath: view | set | add | remove; '[-]' appends "
             "to an array.",
             ToolProperties(kind="write", journaled=True, command_arg="operation",
                            read_commands=frozenset({"view"}))),
    _declare("apply_patch", PatchArgs,
             "Apply a unified diff to workspace files (all or nothing).",
             ToolProperties(kind="write", journaled=True)),
    _declare("undo_patch", UndoPatchArgs,
             "Undo a patch applied with apply_patch (default: the latest).",
             ToolProperties(kind="write", journaled=True, reviewed=False)),
    _declare("search_semantic", SemanticSearchArgs,
             "Find code by meaning or by name (e.g. 'where is the retry policy configured'); "
             "returns the best-matching definitions (function, method or class) with path and "
             "line range.",
             ToolProperties(kind="read")),
])

COMPLETE_STEP_SPEC = ToolSpec(
    name=COMPLETE_STEP,
    description="Mark a plan step (1-based) as done, with a one-line summary.",
    parameters={
        "type": "object",
        "properties": {"step": {"type": "integer", "minimum": 1},
                       "summary": {"type": "string"}},
        "required": ["step", "summary"],
    },
)


@functools.cache
def _all_specs(names: tuple[str, ...]) -> tuple[ToolSpec, ...]:
    """JSON schemas are costly to build; they change only when a tool is declared."""
    return (*(TOOLS[name].spec() for name in names), COMPLETE_STEP_SPEC)


def tool_specs(names: list[str] | None = None) -> list[ToolSpec]:
    return [spec for spec in _all_specs(tuple(TOOLS)) if names is None or spec.name in names]


def tool_properties(name: str) -> ToolProperties | None:
    """A built-in tool's properties (complete_step: a control tool); None: no such tool."""
    if name == COMPLETE_STEP:
        return CONTROL
    declaration = TOOLS.get(name)
    return declaration.properties if declaration is not None else None


def tool_activity_options(name: str) -> ToolActivityOptions:
    """The options of the `refloop.tool.<name>` activity: the tool's own timeouts and
    retries (one attempt for a tool that is neither idempotent nor journaled)."""
    declaration = TOOLS.get(name)
    return declaration.properties.activity if declaration is not None else TOOL_ACTIVITY


def is_edit(name: str, arguments: dict[str, Any]) -> bool:
    """A call that changes the workspace through the edit journal: a journaled tool, and
    not one of its read-only sub-commands (`view`)."""
    properties = tool_properties(name)
    return properties is not None and properties.journaled \
        and properties.kind_of(arguments) != "read"
