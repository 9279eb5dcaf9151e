"""The tool pick: a two-step answer for an endpoint that cannot stream a tool call it
chooses itself.

llama-cpp-python 0.3.36 under `tool_choice: auto` ends such a stream without a chunk, and
unstreamed it drops max_tokens, so a runaway answer there would never be cut. Once an
endpoint is seen doing that, a request offering tools is asked which tool first (a call
of TOOL_PICK_NAME, capped at PICK_MAX_TOKENS), then for the call with that tool named (or
`none`): both stream, so both end at their caps. Kept apart from `refloop.llm.gateway`,
which sends the requests, so that the request path reads as one thing.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from refloop.contract.messages import TokenUsage, ToolSpec
from refloop.contract.text import first_json_object
from refloop.llm.prompts import NO_TOOL, TOOL_PICK_NAME, tool_pick_spec
from refloop.llm.wire import ChatOutcome

# A tool pick is a call `{"tool": NAME}`: a few tokens, with room for long MCP tool names.
PICK_MAX_TOKENS = 48

# One answer: ask(tools offered, tool_choice, picking). `picking` asks for the pick (no
# response format, PICK_MAX_TOKENS); otherwise the caller's own request.
Ask = Callable[[list[ToolSpec] | None, Any, bool], Awaitable[ChatOutcome]]


class PickTheToolFirst(Exception):
    """The endpoint was just found unable to stream a tool call it chooses itself."""


def picked_tool(pick: ChatOutcome, names: list[str]) -> str | None:
    """The offered tool a pick names (its call, else JSON in its text), else None."""
    value: Any = next((call.arguments for call in pick.tool_calls
                       if call.name == TOOL_PICK_NAME), None)
    if value is None:
        candidate = first_json_object(pick.content or "")
        try:
            value = json.loads(candidate) if candidate else None
        except ValueError:
            return None
    name = value.get("tool") if isinstance(value, dict) else None
    return name if name in names else None


def named(tool: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool}}


def stream_feature(extra: dict[str, Any]) -> str:
    """What a request's stream needs of the endpoint (an `EndpointState` field): `stream`
    without tools, `stream_tools` for a tool the model chooses, `stream_named` else."""
    return ("stream" if not extra.get("tools") else
            "stream_tools" if extra.get("tool_choice", "auto") == "auto" else "stream_named")


async def answer_picking_tool(ask: Ask, tools: list[ToolSpec] | None,
                              picks_first: Callable[[], bool]) -> ChatOutcome:
    """One answer; while `picks_first()` says so, a request offering tools is a pick, then
    the call with the picked tool named (or `none`). An answer that raises
    PickTheToolFirst (just learnt) is asked again that way."""
    while True:
        choice, picking, offered = None, TokenUsage(), tools
        if tools and picks_first():
            names = [spec.name for spec in tools]
            offered = [*tools, tool_pick_spec(names)]
            pick = await ask(offered, named(TOOL_PICK_NAME), True)
            name = picked_tool(pick, names)
            choice, picking = named(name) if name else NO_TOOL, pick.usage.usage
        try:
            outcome = await ask(offered, choice, False)
        except PickTheToolFirst:  # just learnt: this endpoint needs the pick
            continue
        outcome.usage.usage = picking.add(outcome.usage.usage)
        outcome.tool_calls = [call for call in outcome.tool_calls
                              if call.name != TOOL_PICK_NAME or offered is tools]
        return outcome
