"""The scripted model's streamed answers (`stream: true`).

OpenAI's chunk format: a role chunk, the content a token (four characters) at a time (a long
answer in at most MAX_PIECES pieces), each
tool call as a first delta with its id and name then its arguments in pieces, the finish
chunk, and, when the request asks (`stream_options.include_usage`), a last chunk with the
usage. Two ways real servers misbehave, per scripted entry: `runaway` ignores `max_tokens`
and streams until the client hangs up (a tool call: its arguments never close);
`stall_after: N` sends N tokens, then nothing. An endpoint may also repeat a call's
fields in every delta, as llama-cpp-python does (`call_delta`). What was sent is logged per request
(`chunks`, `hung_up`), as the server's own count.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

TOKEN_CHARS = 4
# A long answer (a megabyte argument) goes in at most this many pieces, not one per token.
MAX_PIECES = 2000
RUNAWAY_TEXT = "la "
STALL_S = 3600.0


def pieces(text: str) -> list[str]:
    size = max(TOKEN_CHARS, -(-len(text) // MAX_PIECES))
    return [text[i:i + size] for i in range(0, len(text), size)]


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


def chunk(base: dict[str, Any], delta: dict[str, Any],
          finish_reason: str | None = None) -> bytes:
    return sse({**base, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})


def call_delta(index: int, call: dict[str, Any], arguments: str,
               repeat_fields: bool) -> dict[str, Any]:
    """One piece of a tool call. OpenAI names the call in its first delta only;
    llama-cpp-python 0.3.36 (`repeat_fields`) repeats its id, type and name in every delta,
    with the legacy `function_call` beside them."""
    name = call["function"]["name"]
    if not repeat_fields:
        return {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}
    return {"function_call": {"name": name, "arguments": arguments},
            "tool_calls": [{"index": index, "id": call["id"], "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}


def token_deltas(message: dict[str, Any], repeat_fields: bool = False) -> list[dict[str, Any]]:
    """The deltas of one answer, one token each (a tool call's first delta is its name)."""
    deltas: list[dict[str, Any]] = [{"content": piece}
                                    for piece in pieces(message.get("content") or "")]
    for index, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                       "function": {"name": call["function"]["name"],
                                                    "arguments": ""}}]})
        deltas += [call_delta(index, call, piece, repeat_fields)
                   for piece in pieces(call["function"]["arguments"])]
    return deltas


def runaway_deltas(message: dict[str, Any], repeat_fields: bool = False
                   ) -> Iterator[dict[str, Any]]:
    """A server ignoring max_tokens: the text, or the first tool call's arguments, go on."""
    calls = message.get("tool_calls") or []
    piece: dict[str, Any] = {"content": RUNAWAY_TEXT}
    if calls:
        yield token_deltas({"tool_calls": calls[:1]})[0]  # the call's id and name
        piece = call_delta(0, calls[0], RUNAWAY_TEXT, repeat_fields)
    while True:
        yield piece


async def stream_answer(base: dict[str, Any], message: dict[str, Any], finish_reason: str,
                        usage: dict[str, Any] | None, record: dict[str, Any],
                        runaway: bool = False, stall_after: int | None = None,
                        token_s: float = 0.0, repeat_fields: bool = False
                        ) -> AsyncIterator[bytes]:
    """The chunks of one answer; `record` counts the tokens sent and notes a hang-up."""
    record.update(chunks=0, hung_up=False)
    try:
        yield chunk(base, {"role": "assistant"})
        deltas = (runaway_deltas(message, repeat_fields) if runaway
                  else iter(token_deltas(message, repeat_fields)))
        while True:
            delta = next(deltas, None)
            if delta is None:
                break
            if stall_after is not None and record["chunks"] >= stall_after:
                await asyncio.sleep(STALL_S)
            yield chunk(base, delta)
            record["chunks"] += 1
            # A pause per token (at least a turn of the loop): a hang-up is noticed here.
            await asyncio.sleep(token_s)
        yield chunk(base, {}, finish_reason)
        if usage is not None:
            yield sse({**base, "object": "chat.completion.chunk", "choices": [],
                       "usage": usage})
        yield sse("[DONE]")
    except asyncio.CancelledError:
        record["hung_up"] = True
        raise
