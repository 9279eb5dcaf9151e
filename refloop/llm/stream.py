"""Streamed model answers: counted as they arrive, cut at the cap, timed by progress.

A server may ignore `max_tokens` (llama-cpp-python 0.3.36 does on its `tool_choice: auto`
path) and generate until its context is full. So every request streams, and refloop keeps
the bound itself:

- Counting. The server's own usage when it sends one (`stream_options.include_usage`, at
  the end of the stream). Until then, and when it sends none, an estimate: one token per
  chunk that carries text (llama.cpp, vLLM, Ollama and OpenAI send one token a chunk), or
  a quarter of the characters received when that is more.
- Hang-up. Once as many chunks carrying text have arrived as the request's `max_tokens`
  (or the text passes twice the cap at four characters a token: a server that sends many
  tokens a chunk), refloop closes the connection and keeps what it has as
  `finish_reason: length`, as a server that honoured the cap would have answered.
  llama.cpp finishes the token it is on and stops once the client is gone.
- Time. The first chunk may take the request's whole time bound (queueing, a long prompt,
  a reasoning model thinking silently). After it, a gap longer than the idle timeout is a
  stalled server: retried like any transport fault. Tokens still flowing when the time
  bound passes is a runaway: cut like an answer past its cap, not retried.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Literal

from refloop.contract.messages import TokenUsage

CHARS_PER_TOKEN = 4
Cut = Literal["max_tokens", "time"]


class StreamStalled(Exception):
    """No chunk for the idle timeout after the answer began."""

    def __init__(self, tally: StreamTally, idle_s: float) -> None:
        super().__init__(f"model endpoint stalled: no token for {idle_s:g} s "
                         f"after {tally.text_chunks} streamed")
        self.tally = tally


class NoFirstChunk(Exception):
    """The time bound passed before the first chunk arrived."""


class StreamInterrupted(Exception):
    """The stream ended with no finish_reason: the server stopped it (llama-cpp-python
    ends a stream when another request waits)."""

    def __init__(self, tally: StreamTally) -> None:
        super().__init__(f"the model endpoint ended the stream after {tally.text_chunks} "
                         "tokens without a finish_reason")
        self.tally = tally


class EmptyStream(Exception):
    """The stream ended without a single chunk: the server could not stream this request
    (llama-cpp-python 0.3.36 drops the connection when `tool_choice: auto` picks a tool)."""

    def __init__(self) -> None:
        super().__init__("the stream ended without a chunk")


@dataclass
class PartialCall:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamTally:
    """What a stream has delivered so far."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, PartialCall] = field(default_factory=dict)
    finish_reason: str | None = None
    model: str = ""
    usage: dict[str, Any] | None = None  # the server's usage, when it sent one
    chunks: int = 0  # every chunk, text or not
    text_chunks: int = 0  # chunks carrying generated text (content, reasoning, a call)
    chars: int = 0
    cut: Cut | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        """Fold in one chunk, the JSON object the server sent (`raw_chunks`)."""
        self.chunks += 1
        self.model = chunk.get("model") or self.model
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if delta is None:
                continue
            chars = self._take(delta)
            # A tool call's delta is a generated token even when it adds no character
            # (llama-cpp-python sends such deltas, and counts them).
            if chars or delta.get("tool_calls") or delta.get("function_call") is not None:
                self.text_chunks += 1
                self.chars += chars

    def _take(self, delta: dict[str, Any]) -> int:
        """Fold one delta in; the characters of generated text it carried."""
        chars = 0
        content = delta.get("content")
        if content:
            self.content.append(content)
            chars += len(content)
        for name in ("reasoning_content", "reasoning"):  # counted, never shown
            if isinstance(delta.get(name), str):
                chars += len(delta[name])
        deltas = delta.get("tool_calls") or []
        if not deltas and delta.get("function_call") is not None:  # the legacy form
            deltas = [{"index": 0, "function": delta["function_call"]}]
        for call_delta in deltas:
            call = self.calls.setdefault(call_delta.get("index") or 0, PartialCall())
            call.id = call_delta.get("id") or call.id
            function = call_delta.get("function")
            if function is not None:
                name, arguments = function.get("name"), function.get("arguments")
                # A name is sent once, or in pieces; llama-cpp-python repeats it whole in
                # every delta of the call (`next_toolnext_tool...` named no tool).
                if name and name != call.name:
                    call.name += name
                    chars += len(name)
                if arguments:
                    call.arguments.append(arguments)
                    chars += len(arguments)
        return chars

    @property
    def started(self) -> bool:
        return self.text_chunks > 0

    def estimated_tokens(self) -> int:
        return max(self.text_chunks, math.ceil(self.chars / CHARS_PER_TOKEN))

    def at_cap(self, cap: int) -> bool:
        """The cap is reached for certain: as many text chunks as tokens allowed (each
        holds one token at least), or twice the cap in characters at four a token. Hanging
        up here, not one chunk later, keeps what the server generates (it finishes the
        token it is on) within the cap plus one."""
        return self.text_chunks >= cap or self.chars > 2 * cap * CHARS_PER_TOKEN

    def text(self) -> str | None:
        return "".join(self.content) if self.content else None


def raw_chunks(stream: Any) -> Any:
    """`stream` (the SDK's) made to hand over each chunk as the JSON object the server sent.
    Its own SSE parsing, error events and clean-up stay; what goes is the typed object it
    would build a chunk (nested models: about 5 CPU-ms of a 70-chunk answer against 0.2 for
    the JSON, a tenth of a worker's CPU a model call). Asked for `object`, the SDK returns
    the data as is."""
    if hasattr(stream, "_cast_to"):
        stream._cast_to = object
    return stream


async def read_stream(stream: Any, cap: int, idle_s: float, deadline: float) -> StreamTally:
    """Read `stream` until it ends, reaches the cap, stalls or runs out of time; the
    connection is closed in every case (a server that notices stops generating).
    `deadline` is the loop time the whole request must end by."""
    loop = asyncio.get_running_loop()
    tally = StreamTally()
    iterator = raw_chunks(stream).__aiter__()
    try:
        while True:
            left = deadline - loop.time()
            idle = tally.started and idle_s < left  # which bound a timeout is
            try:
                if left <= 0:
                    raise TimeoutError
                # asyncio.timeout, not wait_for: before 3.12 wait_for can drop a
                # cancellation that comes as the awaited chunk arrives
                async with asyncio.timeout(idle_s if idle else left):
                    chunk = await iterator.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                if idle:
                    raise StreamStalled(tally, idle_s) from None
                if not tally.started:
                    raise NoFirstChunk from None
                tally.cut = "time"
                return tally
            tally.add(chunk)
            if tally.at_cap(cap):
                tally.cut = "max_tokens"
                return tally
    finally:
        await stream.close()
    if tally.chunks == 0:
        raise EmptyStream
    if tally.finish_reason is None:
        raise StreamInterrupted(tally)
    return tally


# ---------------------------------------------------------------- one answer, either way


@dataclass
class Answer:
    """One answer as the gateway reads it, streamed or not."""

    content: str | None
    calls: list[tuple[str | None, str, str]]  # (id, name, raw JSON arguments)
    finish_reason: str | None
    usage: TokenUsage
    model: str = ""
    cut: Cut | None = None


def answer_of(response: Any) -> Answer:
    """A non-streamed completion."""
    raw = getattr(response, "usage", None)
    usage = TokenUsage(prompt_tokens=getattr(raw, "prompt_tokens", 0) or 0,
                       completion_tokens=getattr(raw, "completion_tokens", 0) or 0,
                       total_tokens=getattr(raw, "total_tokens", 0) or 0, calls=1)
    if not response.choices:
        return Answer(None, [], None, usage, getattr(response, "model", "") or "")
    choice = response.choices[0]
    calls = [(call.id, call.function.name, call.function.arguments or "")
             for call in choice.message.tool_calls or []]
    return Answer(choice.message.content, calls, choice.finish_reason, usage,
                  getattr(response, "model", "") or "")


async def streamed_request(request: Awaitable[Any], cap: int, time_s: float, idle_s: float,
                           prompt_chars: int) -> Answer:
    """The answer of a streamed `request` (the SDK's create call): its response headers and
    all its chunks within the request's time bound `time_s` (NoFirstChunk if none came)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + time_s
    try:  # the response's headers count against the request's time bound too
        async with asyncio.timeout_at(deadline):
            stream = await request
    except TimeoutError:
        raise NoFirstChunk from None
    tally = await read_stream(stream, cap, idle_s, deadline)
    return streamed_answer(tally, prompt_chars)


def streamed_answer(tally: StreamTally, prompt_chars: int) -> Answer:
    """A streamed one. Without the server's usage: the estimate (module docstring), the
    prompt at four characters a token. A cut answer keeps only the calls whose arguments
    are complete JSON (a call cut in half is not a call)."""
    raw = tally.usage
    if raw is not None and tally.cut is None:
        prompt = raw.get("prompt_tokens") or 0
        completion = raw.get("completion_tokens") or 0
        usage = TokenUsage(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=raw.get("total_tokens") or prompt + completion,
                           calls=1)
    else:
        prompt = math.ceil(prompt_chars / CHARS_PER_TOKEN)
        completion = tally.estimated_tokens()
        usage = TokenUsage(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=prompt + completion, calls=1, estimated_calls=1)
    if tally.cut is not None:
        usage = usage.add(TokenUsage(cut_calls=1))
    calls = [(call.id, call.name, "".join(call.arguments))
             for _, call in sorted(tally.calls.items())]
    if tally.cut is not None:
        calls = [call for call in calls if _complete_json(call[2])]
    finish = "length" if tally.cut is not None else tally.finish_reason
    return Answer(tally.text(), calls, finish, usage, tally.model, tally.cut)


def _complete_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text or "{}"), dict)
    except ValueError:
        return False
