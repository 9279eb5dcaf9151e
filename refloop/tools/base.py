"""What every tool shares: the failure type, the call context and the registry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from refloop.models import ToolResult, ToolSpec
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
    edits: bool = False  # journaled: a retried call never applies twice
    blocking: bool = True  # does file I/O: run in a thread


    def spec(self) -> ToolSpec:
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)


TOOLS: dict[str, ToolDef] = {}


def tool(name: str, args: type[BaseModel], description: str, edits: bool = False,
         blocking: bool = True) -> Callable[[ToolFn], ToolFn]:
    """Register a tool; its JSON schema comes from the pydantic args model."""

    def register(fn: ToolFn) -> ToolFn:
        TOOLS[name] = ToolDef(name, description, args, fn, edits, blocking)
        return fn

    return register
