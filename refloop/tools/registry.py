"""The one tool registry: specs for the model, and `execute_tool` for the activities.

Importing the tool modules registers them (decorator registry, schemas from pydantic).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from pydantic import ValidationError

from refloop.contract.models import COMPLETE_STEP, RunToolInput, ToolResult, ToolSpec
from refloop.contract.tool_properties import (
    CONTROL,
    TOOL_ACTIVITY,
    ToolActivityOptions,
    ToolProperties,
)
from refloop.settings import Settings
from refloop.tools import (  # noqa: F401  (registration)
    command,
    edit,
    files,
    json_edit,
    patch,
    semantic_search,
)
from refloop.tools.base import TOOLS, ToolContext, ToolError, UnknownToolError
from refloop.tools.journal import Journal
from refloop.tools.sandbox import workspace_root

T = TypeVar("T")

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
    """JSON schemas are costly to build; they change only when a tool is registered."""
    return (*(TOOLS[name].spec() for name in names), COMPLETE_STEP_SPEC)


def tool_specs(names: list[str] | None = None) -> list[ToolSpec]:
    return [spec for spec in _all_specs(tuple(TOOLS)) if names is None or spec.name in names]


def tool_properties(name: str) -> ToolProperties | None:
    """A built-in tool's properties (complete_step: a control tool); None: no such tool."""
    if name == COMPLETE_STEP_SPEC.name:
        return CONTROL
    definition = TOOLS.get(name)
    return definition.properties if definition is not None else None


def tool_activity_options(name: str) -> ToolActivityOptions:
    """The options of the `refloop.tool.<name>` activity: the tool's own timeouts and
    retries (one attempt for a tool that is neither idempotent nor journaled)."""
    definition = TOOLS.get(name)
    return definition.properties.activity if definition is not None else TOOL_ACTIVITY


async def execute_tool(call: RunToolInput, settings: Settings) -> ToolResult:
    """Run one tool call; expected failures come back as error results for the model."""
    definition = TOOLS.get(call.name)
    if definition is None:
        raise UnknownToolError(f"unknown tool '{call.name}'")
    try:
        args = definition.args.model_validate(call.arguments)
    except ValidationError as err:
        details = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'args'}: {e['msg']}" for e in err.errors()
        )
        return ToolResult(ok=False, error=f"E_INVALID_ARGS: {details}")
    try:
        root = workspace_root(call.workspace)
        ctx = ToolContext(root, settings, call.call_id, call.allow_network,
                          call.allow_shell_operators)
        if definition.edits:
            return await asyncio.to_thread(_journaled, definition, ctx, args)
        if definition.blocking:  # file I/O stays off the worker's event loop
            return await asyncio.to_thread(run_in_thread_loop, definition.fn(ctx, args))
        return await definition.fn(ctx, args)
    except ToolError as err:
        return ToolResult(ok=False, error=str(err))
    except (OSError, ValueError, RecursionError) as err:  # never an activity failure
        return ToolResult(ok=False, error=f"E_IO: {type(err).__name__}: {str(err)[:300]}")


_thread_loops = threading.local()


def run_in_thread_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a blocking tool's coroutine on its worker thread's own event loop, kept for the
    thread's life (asyncio.run would build and tear down a loop for every call)."""
    loop = getattr(_thread_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _thread_loops.loop = asyncio.new_event_loop()
    return loop.run_until_complete(coroutine)


def _journaled(definition, ctx: ToolContext, args) -> ToolResult:
    """Apply an edit at most once per call id (runs in a thread: file I/O only)."""
    journal = Journal.for_call(ctx)
    entry = journal.load(ctx.call_id)
    if entry is not None and entry["result"] is not None:
        return ToolResult.model_validate(entry["result"])
    if entry is not None:
        journal.restore(entry)  # crashed mid-apply: back to the state before this call
    entry = journal.begin(ctx.call_id, definition.name)
    ctx.snapshot = lambda path: journal.snapshot(entry, path)
    try:
        result = run_in_thread_loop(definition.fn(ctx, args))
    except ToolError as err:
        result = ToolResult(ok=False, error=str(err))
    except (OSError, ValueError, RecursionError) as err:
        result = ToolResult(ok=False, error=f"E_IO: {type(err).__name__}: {str(err)[:300]}")
    journal.finish(entry, result)
    return result


__all__ = [
    "TOOLS", "ToolError", "UnknownToolError", "execute_tool", "tool_activity_options",
    "tool_properties", "tool_specs",
]
