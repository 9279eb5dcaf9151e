"""What every tool shares: the failure type, the call context and the registry.

Adding a tool is one module plus one import (in `refloop/tools/__init__.py`): the module
registers it with `@tool(...)`, giving its kind and any property that differs from the
kind's defaults (`refloop.tool_properties`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from refloop.contract.models import ToolResult, ToolSpec
from refloop.contract.tool_properties import ToolKind, ToolProperties
from refloop.settings import Settings


class ToolError(Exception):
    """An expected failure: reported to the model as an error result, never raised further."""


class UnknownToolError(ToolError):
    """The registry has no such tool: a programming error, not something to retry."""


@dataclass
class ToolContext:
    workspace: Path
    settings: Settings
    call_id: str
    allow_network: bool = False
    allow_shell_operators: bool = False
    # Set by the journal for edit tools: records a file's pre-image before it is written.
    snapshot: Callable[[Path], None] = field(default=lambda path: None)


ToolFn = Callable[[ToolContext, BaseModel], Awaitable[ToolResult]]


@dataclass(frozen=True)
class ToolDef:
    name: str
    description: str
    args: type[BaseModel]
    fn: ToolFn
    properties: ToolProperties
    blocking: bool = True  # does file I/O: run in a thread

    @property
    def edits(self) -> bool:
        """Journaled: a retried call never applies twice."""
        return self.properties.journaled

    def spec(self) -> ToolSpec:
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)


TOOLS: dict[str, ToolDef] = {}


def tool(name: str, args: type[BaseModel], description: str, *, kind: ToolKind,
         edits: bool = False, blocking: bool = True,
         **properties: Any) -> Callable[[ToolFn], ToolFn]:
    """Register a tool; its JSON schema comes from the pydantic args model, its properties
    from `kind` and the keyword arguments of `ToolProperties` (`edits`: journaled)."""
    props = ToolProperties(kind=kind, journaled=edits, **properties)
    if props.kind == "control":
        raise ValueError(f"tool {name!r}: control tools are the workflow's own")

    def register(fn: ToolFn) -> ToolFn:
        TOOLS[name] = ToolDef(name, description, args, fn, props, blocking)
        return fn

    return register
