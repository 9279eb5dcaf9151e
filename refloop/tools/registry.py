"""The one tool registry: `execute_tool` runs a built-in tool's implementation for its
activity. What a tool is (specs, properties, activity options) is declared in
`refloop.contract.tool_catalog`; importing the tool modules registers the implementations.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from refloop.contract.activity_io import RunToolInput, ToolResult
from refloop.contract.errors import ToolError, UnknownToolError
from refloop.contract.tool_catalog import TOOLS
from refloop.settings import Settings
from refloop.tools import (  # noqa: F401  (registration)
    command,
    edit,
    files,
    json_edit,
    patch,
    semantic_search,
)
from refloop.tools.base import IMPLEMENTATIONS, Implementation, ToolContext
from refloop.tools.journal import Journal
from refloop.tools.sandbox import keeping_out, pinned_workspace, shown

T = TypeVar("T")


async def execute_tool(call: RunToolInput, settings: Settings) -> ToolResult:
    """Run one tool call; expected failures come back as error results for the model."""
    declaration, implementation = TOOLS.get(call.name), IMPLEMENTATIONS.get(call.name)
    if declaration is None or implementation is None:
        raise UnknownToolError(f"unknown tool '{call.name}'")
    try:
        args = declaration.args.model_validate(call.arguments)
    except ValidationError as err:
        details = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'args'}: {e['msg']}" for e in err.errors()
        )
        return ToolResult(ok=False, error=f"E_INVALID_ARGS: {details}")
    try:
        # The workspace checked and held for the whole call: every open starts from it;
        # refloop's own state in it is refused wherever it sits.
        with pinned_workspace(call.workspace) as root, keeping_out(settings):
            ctx = ToolContext(root, settings, call.call_id, call.allow_network,
                              call.allow_shell_operators)
            if declaration.properties.journaled:
                result = await asyncio.to_thread(_journaled, call.name, implementation, ctx,
                                                 args)
            elif implementation.blocking:  # file I/O stays off the worker's event loop
                result = await asyncio.to_thread(run_in_thread_loop,
                                                 implementation.fn(ctx, args))
            else:
                result = await implementation.fn(ctx, args)
    except ToolError as err:
        result = ToolResult(ok=False, error=str(err))
    except (OSError, ValueError, RecursionError) as err:  # never an activity failure
        result = ToolResult(ok=False, error=f"E_IO: {type(err).__name__}: {str(err)[:300]}")
    return serialisable(result)


def serialisable(result: ToolResult) -> ToolResult:
    """A file name that is not UTF-8 reaches text as lone surrogates, which no encoder
    takes: every string of the result is shown escaped instead (a task never fails on it)."""
    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return shown(value, keep="\n\t")
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    try:
        result.model_dump_json()
    except (UnicodeEncodeError, ValueError):
        return ToolResult.model_validate(clean(result.model_dump()))
    return result


_thread_loops = threading.local()


def run_in_thread_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a blocking tool's coroutine on its worker thread's own event loop, kept for the
    thread's life (asyncio.run would build and tear down a loop for every call)."""
    loop = getattr(_thread_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _thread_loops.loop = asyncio.new_event_loop()
    return loop.run_until_complete(coroutine)


def _journaled(name: str, implementation: Implementation, ctx: ToolContext,
               args: BaseModel) -> ToolResult:
    """Apply an edit at most once per call id (runs in a thread: file I/O only)."""
    journal = Journal.for_call(ctx)
    entry = journal.load(ctx.call_id)
    if entry is not None and entry["result"] is not None:
        return ToolResult.model_validate(entry["result"])
    if entry is not None:
        journal.restore(entry)  # crashed mid-apply: back to the state before this call
    entry = journal.begin(ctx.call_id, name)
    ctx.snapshot = lambda path: journal.snapshot(entry, path)
    try:
        result = run_in_thread_loop(implementation.fn(ctx, args))
    except ToolError as err:
        result = ToolResult(ok=False, error=str(err))
    except (OSError, ValueError, RecursionError) as err:
        result = ToolResult(ok=False, error=f"E_IO: {type(err).__name__}: {str(err)[:300]}")
    journal.finish(entry, result)
    return result


__all__ = ["execute_tool", "run_in_thread_loop"]
