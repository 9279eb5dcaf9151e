"""The one output pipeline of tool results, built-in and MCP alike: offloaded arguments
come back whole; long outputs are windowed around the task's keywords instead of cut at the
head (with markers saying which lines were left out); a large output goes to the blob store
and the result carries a marker."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import ToolError
from refloop.contract.policies import TOOL_RESULT_CHARS
from refloop.contract.tool_properties import ToolProperties
from refloop.store.blobs import (
    Get,
    Put,
    holds_large_string,
    holds_marker,
    offload_output,
    resolve_args,
)

# What the model reads of one result, less the "[tool] ok" header the workflow adds.
FEEDBACK_CHARS = TOOL_RESULT_CHARS - 100

CONTEXT_LINES = 3
async def whole_arguments(arguments: dict[str, Any], get: Get) -> dict[str, Any]:
    """The call's arguments with the large strings the act activity offloaded put back.
    Only then does the work hop to a thread for the store: a busy worker pays for every
    thread hop."""
    try:
        marked = holds_marker(arguments)
    except RecursionError:  # hostile nesting: a tool error the model reads, not a retry
        raise ToolError("E_INVALID_ARGS: the arguments nest too deeply") from None
    return await asyncio.to_thread(resolve_args, arguments, get) if marked else arguments


async def arguments_or_refusal(arguments: dict[str, Any], get: Get
                               ) -> dict[str, Any] | ToolResult:
    """`whole_arguments`, or the failed result the model reads when they cannot be."""
    try:
        return await whole_arguments(arguments, get)
    except ToolError as err:
        return ToolResult(ok=False, error=str(err))


async def output_for_model(output: str, windowed: bool | None, keywords: list[str],
                           threshold: int, put: Put) -> str:
    """What goes back in the result: windowed if the tool's output is (`windowed`), and a
    blob marker instead of a string over `threshold` bytes."""
    if windowed:
        output = window_text(output, keywords, FEEDBACK_CHARS)
    if holds_large_string(output, threshold):
        output = await asyncio.to_thread(offload_output, output, threshold, put)
    return output


def tool_feedback(output: str, properties: ToolProperties, keywords: list[str],
                  limit: int) -> str:
    """What the model reads of a tool's output. A `windowed` tool's output is a listing
    whose relevant part can be anywhere: windowed around the keywords. Any other output is
    left whole here; the workflow cuts it at the end."""
    return window_text(output, keywords, limit) if properties.windowed else output


def window_text(text: str, keywords: list[str], limit: int) -> str:
    """`text` if it fits in `limit` characters; else the head and the tail, plus the
    lines around keyword hits (best-scoring first), in order with omission markers."""
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    pattern = _keyword_pattern(keywords)
    scores = [len(set(pattern.findall(line.lower()))) if pattern else 0 for line in lines]
    keep: set[int] = set()
    budget = limit - 200  # room for the markers

    def take(first: int, last: int) -> bool:
        nonlocal budget
        new = [i for i in range(max(first, 0), min(last, len(lines) - 1) + 1) if i not in keep]
        cost = sum(len(lines[i]) + 1 for i in new)
        if first - 1 not in keep:  # a new region costs a marker line
            cost += 60
        if cost > budget:
            return False
        keep.update(new)
        budget -= cost
        return True

    take(0, CONTEXT_LINES * 2)  # the head: a header, the first lines of a file
    take(len(lines) - CONTEXT_LINES * 2, len(lines) - 1)  # the tail: a command's verdict
    hits = sorted((i for i, score in enumerate(scores) if score), key=lambda i: (-scores[i], i))
    for index in hits:
        take(index - CONTEXT_LINES, index + CONTEXT_LINES)
    # Spend what is left from the top down, so a keyword-free output shows its start.
    for index in range(len(lines)):
        if index not in keep and not take(index, index):
            break
    if not keep:  # one huge line: nothing to window
        cut = limit - 80
        return f"{text[:cut]}\n[... {len(text) - cut} characters left out ...]"
    return _render(lines, sorted(keep), keywords)


def _keyword_pattern(keywords: list[str]) -> re.Pattern[str] | None:
    if not keywords:
        return None
    return re.compile("|".join(re.escape(k.lower()) for k in keywords))


def _render(lines: list[str], kept: list[int], keywords: list[str]) -> str:
    out: list[str] = []
    previous = -1
    for index in kept:
        if index > previous + 1:
            out.append(_marker(previous + 1, index - 1))
        out.append(lines[index])
        previous = index
    if previous < len(lines) - 1:
        out.append(_marker(previous + 1, len(lines) - 1))
    out.append(f"[windowed around: {', '.join(keywords) or '(no keywords)'}; "
               f"{len(lines) - len(kept)} of {len(lines)} lines left out]")
    return "\n".join(out)


def _marker(first: int, last: int) -> str:
    count = last - first + 1
    return (f"[... {count} line{'s' if count > 1 else ''} left out "
            f"(output lines {first + 1}-{last + 1}) ...]")
