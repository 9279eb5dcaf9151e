"""What every tool shares: the failure type, the call context and the registry.

Adding a tool is a declaration in `refloop.contract.tool_catalog` (name, description,
argument model, properties) plus its implementation here, registered with `@tool(name)`
and imported by `refloop.tools.registry`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from refloop.contract.activity_io import ToolResult
from refloop.contract.tool_catalog import TOOLS, declare
from refloop.contract.tool_properties import ToolKind, ToolProperties
from refloop.settings import Settings


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
class Implementation:
    fn: ToolFn
    blocking: bool = True  # does file I/O: run in a thread


# The implementations of the catalogue's tools (`refloop.contract.tool_catalog.TOOLS`).
IMPLEMENTATIONS: dict[str, Implementation] = {}


def tool(name: str, args: type[BaseModel] | None = None, description: str = "", *,
         kind: ToolKind | None = None, edits: bool = False, blocking: bool = True,
         **properties: Any) -> Callable[[ToolFn], ToolFn]:
    """Register the implementation of tool `name`. A built-in is declared in the catalogue;
    a new tool declares itself here: its JSON schema comes from the pydantic `args` model,
    its properties from `kind` and the keyword arguments of `ToolProperties` (`edits`:
    journaled)."""
    if args is not None:
        if kind is None:
            raise ValueError(f"tool {name!r}: a new tool needs its kind")
        declare(name, args, description,
                ToolProperties(kind=kind, journaled=edits, **properties))
    elif name not in TOOLS:
        raise ValueError(f"tool {name!r} is not declared: give its args, description and kind")

    def register(fn: ToolFn) -> ToolFn:
        IMPLEMENTATIONS[name] = Implementation(fn, blocking)
        return fn

    return register
